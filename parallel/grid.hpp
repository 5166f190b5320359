// Where a rank sits in the pipeline, on top of comm::grid_groups (plan/grid.hpp owns
// the rank arithmetic: rank = (d * pp + p) * tp + t, tensor innermost).
//
// Worked example, dp = pp = tp = 2 (8 ranks), pipeline groups {0,2} {1,3} {4,6} {5,7}:
//   rank  (d,p,t)  stage  pipeline group  prev  next  first  last  embedding group
//   0     (0,0,0)  0      {0,2}           -     2     yes    no    {0,2}
//   1     (0,0,1)  0      {1,3}           -     3     yes    no    {1,3}
//   2     (0,1,0)  1      {0,2}           0     -     no     yes   {0,2}
//   3     (0,1,1)  1      {1,3}           1     -     no     yes   {1,3}
//   4..7: the same with d = 1 (groups {4,6} {5,7}).
// prev/next are global ranks; inside the pipeline group's communicator the
// rank of stage p is p itself (groups list ranks in order of p).
// With virtual stages (interleaved pipeline) model chunk k lives on pipeline
// rank k % pp as its local chunk k / pp, so the last rank's chunk c feeds the
// first rank's chunk c + 1: the wrapped neighbours are prev_wrapped/next_wrapped.
#pragma once

#include <vector>

#include "comm/groups.hpp"

namespace troupe::parallel {

struct PipelinePlace {
  int rank = 0;  // global rank
  comm::GridCoord coord{0, 0, 0};
  int pp = 1;                        // pipeline size
  int stage = 0;                     // = coord.p
  bool first = true;                 // holds the embedding (model chunk 0)
  bool last = true;                  // holds the head (last model chunk)
  int prev = -1;                     // global rank of stage p-1, -1 on the first stage
  int next = -1;                     // global rank of stage p+1, -1 on the last stage
  int prev_wrapped = 0;              // global rank of stage (p-1) mod pp
  int next_wrapped = 0;              // global rank of stage (p+1) mod pp
  std::vector<int> pipeline_group;   // global ranks, index = stage
  std::vector<int> embedding_group;  // global ranks {first stage, last stage}; one rank when pp == 1
};

// Throws CommError{invalid_argument} for a rank outside the grid or a bad grid.
PipelinePlace pipeline_place(int rank, int dp, int pp, int tp);

// The embedding group as ranks of the pipeline group's communicator: {0, pp-1},
// or {0} when pp == 1 (the tied weight needs no exchange then).
std::vector<int> embedding_group_in_pipeline(int pp);

}  // namespace troupe::parallel
