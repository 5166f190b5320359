// Text that came from outside (a socket, a file, a peer): UTF-8 checks and
// repair, JSON that never throws on the way out, and comparison of secrets in
// constant time.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace troupe {

// The byte offset of the first byte that is not part of well-formed UTF-8
// (overlong forms, surrogates and code points above U+10FFFF are ill-formed),
// or std::string_view::npos when all of it is.
size_t invalid_utf8_at(std::string_view s);
inline bool valid_utf8(std::string_view s) { return invalid_utf8_at(s) == std::string_view::npos; }

// s with every ill-formed sequence replaced by U+FFFD, cut to at most max_bytes
// (never inside a character).
std::string sanitize_utf8(std::string_view s, size_t max_bytes = std::string::npos);

// s made well-formed as Python's s.decode("utf-8", errors="replace") and a browser's
// TextDecoder make it: each maximal subpart of an ill-formed sequence (Unicode 15, section 3.9:
// a truncated sequence is one subpart, a stray continuation byte another) becomes one U+FFFD.
//   "a\xE2\x82b" -> "a\uFFFDb",  "\xF0\x80" -> "\uFFFD\uFFFD" (0x80 cannot follow 0xF0)
std::string replace_invalid_utf8(std::string_view s);

// JSON text of j; strings that are not UTF-8 are repaired (U+FFFD), never thrown on.
std::string json_text(const nlohmann::json& j, int indent = -1);

// a == b in time that depends only on the lengths, for tokens and secrets.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace troupe
