// Schedule tests' helpers: a table as text, one line per rank ("rank 0: F0 F1 B0 W0 ..."),
// and what the checker says of a table ("" when it proves it).
#pragma once

#include <string>

#include "plan/schedule.hpp"

namespace troupe::plan {

inline std::string table_text(const Schedule& s) {
  std::string out;
  for (int p = 0; p < s.pp; ++p) {
    out += "rank " + std::to_string(p) + ":";
    for (const Op& op : s.ranks[p]) out += " " + to_string(op);
    out += "\n";
  }
  return out;
}

inline std::string error_of(const Schedule& s, const CheckOptions& opt = {}) {
  try {
    check_schedule(s, opt);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

}  // namespace troupe::plan
