#include "parallel/grid.hpp"

namespace troupe::parallel {

PipelinePlace pipeline_place(int rank, int dp, int pp, int tp) {
  PipelinePlace s;
  s.rank = rank;
  s.coord = comm::grid_coord(rank, dp, pp, tp);
  const comm::GridGroups groups = comm::grid_groups(dp, pp, tp);
  s.pp = pp;
  s.stage = s.coord.p;
  s.first = s.stage == 0;
  s.last = s.stage == pp - 1;
  s.pipeline_group = comm::group_of(groups.pipeline, rank);
  s.prev = s.first ? -1 : s.pipeline_group[s.stage - 1];
  s.next = s.last ? -1 : s.pipeline_group[s.stage + 1];
  s.prev_wrapped = s.pipeline_group[(s.stage + pp - 1) % pp];
  s.next_wrapped = s.pipeline_group[(s.stage + 1) % pp];
  s.embedding_group = {s.pipeline_group.front()};
  if (pp > 1) s.embedding_group.push_back(s.pipeline_group.back());
  return s;
}

std::vector<int> embedding_group_in_pipeline(int pp) {
  if (pp <= 1) return {0};
  return {0, pp - 1};
}

}  // namespace troupe::parallel
