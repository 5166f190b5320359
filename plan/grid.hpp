// The rank grid of a job: dp × pp × tp ranks, tensor innermost. This is the one
// place that says which rank sits where; the coordinator, the engine, the
// communicator groups and the checkpoint layout all ask it.
//
//   rank = (d * pp + p) * tp + t
//
// Worked example, dp = pp = tp = 2 (8 ranks):
//   rank  0 1 2 3 4 5 6 7
//   d     0 0 0 0 1 1 1 1
//   p     0 0 1 1 0 0 1 1
//   t     0 1 0 1 0 1 0 1
// Tensor ranks are neighbours (they exchange every layer, so they should share a
// host); a data replica's pipeline is a contiguous run of pp * tp ranks.
#pragma once

#include <cstdint>
#include <string>

#include "core/layout.hpp"

namespace troupe::plan {

using troupe::Layout;

// Grid coordinates: data replica d, pipeline stage p, tensor shard t.
struct Coord {
  int d = 0, p = 0, t = 0;
  bool operator==(const Coord& o) const { return d == o.d && p == o.p && t == o.t; }
};

// The most ranks a layout may have (far beyond any cluster; keeps rank arithmetic in int).
inline constexpr int kMaxWorld = 1 << 20;

// Throws troupe::Error unless every degree is >= 1 and the world is at most kMaxWorld.
void check_layout(const Layout& layout);
// Throws troupe::Error for a coordinate (or rank) outside the grid.
int rank_of(const Layout& layout, const Coord& c);
Coord coord_of(const Layout& layout, int rank);

}  // namespace troupe::plan
