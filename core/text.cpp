#include "core/text.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace troupe {

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 when it is ill-formed
// (Unicode 15, table 3-7).
size_t sequence_at(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const size_t left = s.size() - i;
  auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 2) return 0;
    const unsigned char c1 = b(1);
    const bool ok1 = c == 0xE0   ? (c1 >= 0xA0 && c1 <= 0xBF)
                     : c == 0xED ? (c1 >= 0x80 && c1 <= 0x9F)
                                 : cont(1);
    return ok1 && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 2) return 0;
    const unsigned char c1 = b(1);
    const bool ok1 = c == 0xF0   ? (c1 >= 0x90 && c1 <= 0xBF)
                     : c == 0xF4 ? (c1 >= 0x80 && c1 <= 0x8F)
                                 : cont(1);
    return ok1 && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = sequence_at(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string sanitize_utf8(std::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes == std::string::npos ? s.size() : max_bytes));
  for (size_t i = 0; i < s.size();) {
    size_t n = sequence_at(s, i);
    std::string_view piece = n ? s.substr(i, n) : std::string_view("\xEF\xBF\xBD");
    if (max_bytes != std::string::npos && out.size() + piece.size() > max_bytes) break;
    out.append(piece);
    i += n ? n : 1;
  }
  return out;
}

std::string replace_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_at(s, i);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // The maximal subpart: the lead byte and the continuation bytes that could still have
    // completed it (table 3-7's ranges for the second byte).
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    const size_t want = c >= 0xC2 && c <= 0xDF   ? 2
                        : c >= 0xE0 && c <= 0xEF ? 3
                        : c >= 0xF0 && c <= 0xF4 ? 4
                                                 : 1;
    for (size_t k = 1; k < want && i + k < s.size(); ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      const bool ok = k > 1       ? (b & 0xC0) == 0x80
                      : c == 0xE0 ? b >= 0xA0 && b <= 0xBF
                      : c == 0xED ? b >= 0x80 && b <= 0x9F
                      : c == 0xF0 ? b >= 0x90 && b <= 0xBF
                      : c == 0xF4 ? b >= 0x80 && b <= 0x8F
                                  : (b & 0xC0) == 0x80;
      if (!ok) break;
      len = k + 1;
    }
    out.append("\xEF\xBF\xBD");
    i += len;
  }
  return out;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer one is read, whatever the contents.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace troupe
