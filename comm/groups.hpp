// The communicator groups of a dp × pp × tp rank grid (plan/grid.hpp owns the
// rank arithmetic: rank = (d * pp + p) * tp + t, tensor innermost).
//
// Worked example, dp = pp = tp = 2 (8 ranks):
//   tensor groups   (same d, p):  {0,1} {2,3} {4,5} {6,7}
//   pipeline groups (same d, t):  {0,2} {1,3} {4,6} {5,7}
//   data groups     (same p, t):  {0,4} {1,5} {2,6} {3,7}
// Every group lists its ranks in increasing order, which is also the order of
// the coordinate it spans (group rank = t, p or d).
#pragma once

#include <string>
#include <vector>

#include "plan/grid.hpp"

namespace troupe::comm {

struct GridGroups {
  std::vector<std::vector<int>> data, pipeline, tensor;
};

using GridCoord = plan::Coord;

// Throws CommError{invalid_argument} unless dp, pp, tp >= 1.
GridGroups grid_groups(int dp, int pp, int tp);
GridCoord grid_coord(int rank, int dp, int pp, int tp);
// The group among `groups` that holds `rank`, and its name ("dp0", "pp3", ...)
// usable with Communicator::new_group.
const std::vector<int>& group_of(const std::vector<std::vector<int>>& groups, int rank);
std::string group_name(const char* kind, const std::vector<std::vector<int>>& groups, int rank);

}  // namespace troupe::comm
