#include "core/units.hpp"

#include <charconv>
#include <cmath>
#include <utility>

namespace troupe {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A non-negative decimal number at the front of `s`, either as an exact integer (when it has no
// fraction or exponent, so that 2^64-1 bytes survives) or as a double. Returns the unparsed rest.
struct Number {
  bool integral = false;
  uint64_t as_int = 0;
  double as_double = 0;
  std::string_view rest;
};

std::optional<Number> leading_number(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && s[i] == '+') ++i;
  const size_t start = i;
  auto digits = [&] {
    size_t n = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++n;
    return n;
  };
  size_t n_int = digits();
  bool integral = true;
  size_t n_frac = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    n_frac = digits();
    integral = false;
  }
  if (n_int + n_frac == 0) return std::nullopt;
  // An exponent only counts when digits follow it, so "5e" is a number with unit "e" (rejected later).
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t save = i++;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) {
      i = save;
    } else {
      integral = false;
    }
  }
  Number num;
  num.rest = s.substr(i);
  std::string_view body = s.substr(start, i - start);
  if (integral) {
    auto r = std::from_chars(body.data(), body.data() + body.size(), num.as_int);
    if (r.ec != std::errc() || r.ptr != body.data() + body.size()) return std::nullopt;
    num.integral = true;
    num.as_double = static_cast<double>(num.as_int);
  } else {
    // from_chars rejects a leading '.', which people do write (".5s").
    std::string tmp = body.front() == '.' ? "0" + std::string(body) : std::string(body);
    auto r = std::from_chars(tmp.data(), tmp.data() + tmp.size(), num.as_double);
    if (r.ec != std::errc() || r.ptr != tmp.data() + tmp.size() || !std::isfinite(num.as_double))
      return std::nullopt;
  }
  return num;
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  auto num = leading_number(trim(text));
  if (!num) return std::nullopt;
  std::string_view unit = trim(num->rest);
  static const std::pair<std::string_view, double> kUnits[] = {{"", 1000.0},  {"s", 1000.0}, {"sec", 1000.0},
                                                               {"ms", 1.0},   {"us", 1e-3},  {"m", 60e3},
                                                               {"min", 60e3}, {"h", 3600e3}, {"d", 86400e3}};
  for (const auto& [name, ms_per_unit] : kUnits) {
    if (unit != name) continue;
    double ms = std::round(num->as_double * ms_per_unit);
    // 2^53 ms is ~285k years: beyond it the double no longer holds whole milliseconds.
    if (!(ms < 9007199254740992.0)) return std::nullopt;
    if (ms == 0 && num->as_double != 0) return std::nullopt;
    return std::chrono::milliseconds(static_cast<int64_t>(ms));
  }
  return std::nullopt;
}

std::optional<uint64_t> parse_size(std::string_view text) {
  auto num = leading_number(trim(text));
  if (!num) return std::nullopt;
  std::string_view unit = trim(num->rest);
  static const std::pair<std::string_view, uint64_t> kUnits[] = {{"", 1},
                                                                 {"B", 1},
                                                                 {"KiB", 1ull << 10},
                                                                 {"MiB", 1ull << 20},
                                                                 {"GiB", 1ull << 30},
                                                                 {"TiB", 1ull << 40},
                                                                 {"Ki", 1ull << 10},
                                                                 {"Mi", 1ull << 20},
                                                                 {"Gi", 1ull << 30},
                                                                 {"Ti", 1ull << 40},
                                                                 {"kB", 1000},
                                                                 {"KB", 1000},
                                                                 {"MB", 1000000},
                                                                 {"GB", 1000000000},
                                                                 {"TB", 1000000000000ull},
                                                                 {"k", 1000},
                                                                 {"K", 1000},
                                                                 {"M", 1000000},
                                                                 {"G", 1000000000},
                                                                 {"T", 1000000000000ull}};
  for (const auto& [name, mult] : kUnits) {
    if (unit != name) continue;
    if (num->integral) {
      if (num->as_int > UINT64_MAX / mult) return std::nullopt;
      return num->as_int * mult;
    }
    double bytes = std::round(num->as_double * static_cast<double>(mult));
    if (!(bytes < 18446744073709551616.0)) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

std::string format_duration(std::chrono::milliseconds d) {
  int64_t ms = d.count();
  if (ms == 0) return "0s";
  static const std::pair<int64_t, const char*> kUnits[] = {
      {86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
  for (const auto& [per, name] : kUnits)
    if (ms % per == 0) return std::to_string(ms / per) + name;
  return std::to_string(ms) + "ms";
}

std::string format_size(uint64_t bytes) {
  if (bytes == 0) return "0";
  static const std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (const auto& [per, name] : kUnits)
    if (bytes % per == 0) return std::to_string(bytes / per) + name;
  return std::to_string(bytes);
}

}  // namespace troupe
