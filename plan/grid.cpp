#include "plan/grid.hpp"

#include "core/error.hpp"

namespace troupe::plan {

void check_layout(const Layout& l) {
  require(l.dp >= 1 && l.pp >= 1 && l.tp >= 1, "layout ", l.str(),
          ": data, pipeline and tensor degrees must be >= 1");
  require(int64_t(l.dp) * l.pp * l.tp <= kMaxWorld, "layout ", l.str(), " has more than ", kMaxWorld,
          " ranks");
}

int rank_of(const Layout& l, const Coord& c) {
  check_layout(l);
  require(c.d >= 0 && c.d < l.dp && c.p >= 0 && c.p < l.pp && c.t >= 0 && c.t < l.tp, "grid coordinate (d ",
          c.d, ", p ", c.p, ", t ", c.t, ") is outside layout ", l.str());
  return (c.d * l.pp + c.p) * l.tp + c.t;
}

Coord coord_of(const Layout& l, int rank) {
  check_layout(l);
  require(rank >= 0 && rank < l.world(), "rank ", rank, " is outside layout ", l.str(), " (", l.world(),
          " ranks)");
  return {rank / (l.pp * l.tp), (rank / l.tp) % l.pp, rank % l.tp};
}

}  // namespace troupe::plan
