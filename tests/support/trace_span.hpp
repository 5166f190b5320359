// A trace span in one call, for tests that build rank traces by hand.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/trace.hpp"

namespace troupe::testing {

inline trace::Span span(std::string cat, std::string name, int64_t ts, int64_t dur, int64_t step,
                        int track = trace::kEngine,
                        std::vector<std::pair<std::string, std::string>> args = {}) {
  trace::Span s;
  s.cat = std::move(cat);
  s.name = std::move(name);
  s.ts_us = ts;
  s.dur_us = dur;
  s.step = step;
  s.track = track;
  s.args = std::move(args);
  return s;
}

}  // namespace troupe::testing
