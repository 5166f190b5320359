// A job's parallel layout: data x pipeline x tensor degrees. Which rank sits where
// on it is plan/grid.hpp's business; this is the shape and its one spelling.
#pragma once

#include <string>

namespace troupe {

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int world() const { return dp * pp * tp; }
  // "2x1x1" (data x pipeline x tensor): the one spelling of a layout in logs,
  // metrics, the API and checkpoints.
  std::string str() const { return std::to_string(dp) + "x" + std::to_string(pp) + "x" + std::to_string(tp); }
  bool operator==(const Layout& o) const { return dp == o.dp && pp == o.pp && tp == o.tp; }
  bool operator!=(const Layout& o) const { return !(*this == o); }
};

}  // namespace troupe
