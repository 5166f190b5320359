#include "comm/groups.hpp"

#include <algorithm>

#include "comm/error.hpp"
#include "core/error.hpp"

namespace troupe::comm {

GridGroups grid_groups(int dp, int pp, int tp) {
  const plan::Layout layout{dp, pp, tp};
  try {
    plan::check_layout(layout);
  } catch (const Error& e) {
    throw CommError(CommErrc::invalid_argument, std::string("grid_groups: ") + e.what());
  }
  auto rank_of = [&](int d, int p, int t) { return plan::rank_of(layout, {d, p, t}); };
  GridGroups g;
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p) {
      std::vector<int> grp;
      for (int t = 0; t < tp; ++t) grp.push_back(rank_of(d, p, t));
      g.tensor.push_back(grp);
    }
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> grp;
      for (int p = 0; p < pp; ++p) grp.push_back(rank_of(d, p, t));
      g.pipeline.push_back(grp);
    }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> grp;
      for (int d = 0; d < dp; ++d) grp.push_back(rank_of(d, p, t));
      g.data.push_back(grp);
    }
  return g;
}

GridCoord grid_coord(int rank, int dp, int pp, int tp) {
  // The plan's grid decides; its refusal is a communicator argument error here.
  try {
    return plan::coord_of({dp, pp, tp}, rank);
  } catch (const Error& e) {
    throw CommError(CommErrc::invalid_argument, std::string("grid_coord: ") + e.what());
  }
}

static size_t index_of(const std::vector<std::vector<int>>& groups, int rank) {
  for (size_t i = 0; i < groups.size(); ++i)
    if (std::find(groups[i].begin(), groups[i].end(), rank) != groups[i].end()) return i;
  throw CommError(CommErrc::invalid_argument, "group_of: rank " + std::to_string(rank) + " is in no group");
}

const std::vector<int>& group_of(const std::vector<std::vector<int>>& groups, int rank) {
  return groups[index_of(groups, rank)];
}

std::string group_name(const char* kind, const std::vector<std::vector<int>>& groups, int rank) {
  return std::string(kind) + std::to_string(index_of(groups, rank));
}

}  // namespace troupe::comm
