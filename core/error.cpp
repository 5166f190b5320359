#include "core/error.hpp"

namespace troupe::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string s = concat(file, ":", line, ": check failed: ", cond);
  if (!msg.empty()) s += ": " + msg;
  throw Error(s);
}

}  // namespace troupe::detail
