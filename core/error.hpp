// Errors and invariant checks shared by every layer.
//
// Invariants fail fast with file:line (TROUPE_CHECK). Expected failures that a
// caller handles (bad spec, lost peer, timeout) are exceptions or error values
// with a name, defined next to the code that raises them.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace troupe {

// A violated precondition or internal invariant. what() carries file:line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A system call on a file failed; code() is its errno (ENOSPC: the disk is full).
class IoError : public Error {
 public:
  IoError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

// Throws troupe::Error with the message parts when ok is false: for a failure the user
// fixes (a layout, a batch size), which wants a plain message, not TROUPE_CHECK's file:line.
template <class... Args>
void require(bool ok, const Args&... message) {
  if (!ok) throw Error(detail::concat(message...));
}

}  // namespace troupe

// TROUPE_CHECK(cond, "message parts", value, ...) throws troupe::Error with
// "file:line: check failed: cond: message" when cond is false.
#define TROUPE_CHECK(cond, ...)                                                    \
  do {                                                                             \
    if (!(cond))                                                                   \
      ::troupe::detail::check_failed(__FILE__, __LINE__, #cond,                    \
                                     ::troupe::detail::concat("", ##__VA_ARGS__)); \
  } while (0)
