// The parts of core/hf_regex.cpp's matcher shared with its parser (hf_regex_parse.cpp); not
// part of the API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/unicode_tables.hpp"

namespace troupe::hf::detail {

using unicode::Range;
using RangeList = std::vector<Range>;  // sorted, disjoint

// A set of code points: ASCII as a bitmap, the rest as ranges.
struct CharClass {
  uint64_t ascii[2] = {0, 0};
  std::vector<Range> high;  // code points >= 0x80, sorted, disjoint

  explicit CharClass(const RangeList& sorted) {
    for (Range x : sorted) {
      for (uint32_t c = x.first; c <= std::min<uint32_t>(x.last, 0x7F); ++c)
        ascii[c >> 6] |= uint64_t(1) << (c & 63);
      if (x.last >= 0x80) high.push_back({std::max<uint32_t>(x.first, 0x80), x.last});
    }
  }
  bool has(uint32_t c) const {
    if (c < 0x80) return (ascii[c >> 6] >> (c & 63)) & 1;
    auto it =
        std::upper_bound(high.begin(), high.end(), c, [](uint32_t v, const Range& r) { return v < r.first; });
    return it != high.begin() && c <= (it - 1)->last;
  }
};

// The parsed pattern.
struct Node {
  enum Kind { kEmpty, kChar, kClass, kAny, kCat, kAlt, kRepeat, kLook } kind = kEmpty;
  uint32_t ch = 0;
  int cls = -1;
  std::vector<Node> kids;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
  bool greedy = true;
  bool negate = false;  // kLook
};

// Whether n can match the empty string.
bool nullable(const Node& n);

// The tree of `pattern`, its classes appended to `classes`. Throws troupe::Error naming an
// unsupported construct and its offset.
Node parse_regex(std::string_view pattern, std::vector<CharClass>& classes);

}  // namespace troupe::hf::detail
