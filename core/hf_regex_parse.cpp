// Parsing a pre-tokenizer regex (hf_regex.hpp) into a tree, and the character classes it uses,
// from the Unicode tables of core/unicode_tables.cpp.
#include <algorithm>
#include <cctype>

#include "core/error.hpp"
#include "core/hf_regex_internal.hpp"
#include "core/text.hpp"
#include "core/unicode_tables.hpp"

namespace troupe::hf::detail {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxDepth = 100;
constexpr int kMaxCount = 1000;

RangeList normalized(RangeList r) {
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.first < b.first; });
  RangeList out;
  for (const Range& x : r) {
    if (!out.empty() && x.first <= out.back().last + 1)
      out.back().last = std::max(out.back().last, x.last);
    else
      out.push_back(x);
  }
  return out;
}

RangeList complement(const RangeList& sorted) {
  RangeList out;
  uint32_t next = 0;
  for (const Range& x : sorted) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.last + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

void append_category(RangeList& out, std::string_view two) {
  const unicode::Ranges r = unicode::category_ranges(two);
  out.insert(out.end(), r.data, r.data + r.size);
}

// The ranges of a general category name (one or two letters, or a long name); false when the
// name is not one.
bool category(std::string_view name, RangeList* out) {
  static const std::pair<std::string_view, std::string_view> kLong[] = {
      {"Letter", "L"}, {"Mark", "M"},      {"Number", "N"}, {"Punctuation", "P"},
      {"Symbol", "S"}, {"Separator", "Z"}, {"Other", "C"}};
  for (const auto& [l, s] : kLong)
    if (name == l) name = s;
  static const std::pair<char, std::string_view> kGroups[] = {
      {'L', "Lu Ll Lt Lm Lo"}, {'M', "Mn Mc Me"}, {'N', "Nd Nl No"},      {'P', "Pc Pd Ps Pe Pi Pf Po"},
      {'S', "Sm Sc Sk So"},    {'Z', "Zs Zl Zp"}, {'C', "Cc Cf Cs Co Cn"}};
  RangeList r;
  auto add = [&](std::string_view two) {
    if (two != "Cn") {
      append_category(r, two);
      return unicode::category_ranges(two).size > 0;
    }
    RangeList all;  // Cn: what no category holds
    for (const char* c :
         {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
          "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"})
      append_category(all, c);
    const RangeList cn = complement(normalized(all));
    r.insert(r.end(), cn.begin(), cn.end());
    return true;
  };
  if (name.size() == 1) {
    for (const auto& [g, members] : kGroups)
      if (name[0] == g)
        for (size_t i = 0; i < members.size(); i += 3) add(members.substr(i, 2));
    if (r.empty()) return false;
  } else if (name.size() != 2 || !add(name)) {
    return false;
  }
  *out = normalized(std::move(r));
  return true;
}

// Oniguruma's Unicode \s: U+0009..U+000D, U+0085 and the separators Zs, Zl, Zp.
RangeList space_ranges() {
  RangeList r{{0x09, 0x0D}, {0x85, 0x85}};
  for (const char* c : {"Zs", "Zl", "Zp"}) append_category(r, c);
  return normalized(std::move(r));
}

// ---------------------------------------------------------------- parsing

bool ascii_letter(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

class Parser {
 public:
  Parser(std::string_view p, std::vector<CharClass>& classes) : p_(p), classes_(classes) {}

  Node parse() {
    Node n = alternation(0);
    if (i_ < p_.size()) fail("an unmatched ')'", i_);
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw Error("regex " + shown() + ": " + what + " at offset " + std::to_string(at) + " is not supported");
  }
  std::string shown() const {
    std::string s = sanitize_utf8(p_, 200);
    return "\"" + s + (s.size() < p_.size() ? "...\"" : "\"");
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool at(std::string_view s) const { return p_.substr(i_, s.size()) == s; }

  // The code point at i_ (the pattern is UTF-8), advancing past it.
  uint32_t next_cp() {
    const size_t start = i_;
    const std::string_view rest = p_.substr(i_);
    const size_t bad = invalid_utf8_at(rest.substr(0, std::min<size_t>(4, rest.size())));
    const auto b0 = static_cast<unsigned char>(p_[i_]);
    const size_t len = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
    if (bad != std::string_view::npos && bad < len) fail("a byte that is not UTF-8", start);
    uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (size_t k = 1; k < len; ++k) c = c << 6 | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += len;
    return c;
  }

  Node alternation(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth), i_);
    std::vector<Node> alts;
    alts.push_back(sequence(depth));
    while (at('|')) {
      ++i_;
      alts.push_back(sequence(depth));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    Node n;
    n.kind = Node::kAlt;
    n.kids = std::move(alts);
    return n;
  }

  Node sequence(int depth) {
    Node n;
    n.kind = Node::kCat;
    while (i_ < p_.size() && !at('|') && !at(')')) n.kids.push_back(quantified(atom(depth), depth));
    if (n.kids.size() == 1) return std::move(n.kids[0]);
    if (n.kids.empty()) n.kind = Node::kEmpty;
    return n;
  }

  Node quantified(Node a, int depth) {
    const size_t start = i_;
    int lo = 0, hi = 0;
    if (at('?')) {
      lo = 0, hi = 1;
    } else if (at('*')) {
      lo = 0, hi = -1;
    } else if (at('+')) {
      lo = 1, hi = -1;
    } else if (at('{')) {
      if (!count(&lo, &hi)) fail("a '{' that is not a count {n}, {n,} or {n,m} (escape it: \\{)", start);
    } else {
      return a;
    }
    if (p_[start] != '{') ++i_;  // count() moved past the '}
    if (a.kind == Node::kLook || a.kind == Node::kEmpty) fail("a quantifier with nothing to repeat", start);
    bool greedy = true;
    if (at('?')) {
      greedy = false;
      ++i_;
    } else if (at('+')) {
      fail("a possessive quantifier", i_);
    }
    if (at('?') || at('*') || at('+') || at('{')) fail("a quantifier after a quantifier", i_);
    if (hi == -1 && nullable(a)) fail("a repetition of something that can match the empty string", start);
    Node n;
    n.kind = Node::kRepeat;
    n.min = lo;
    n.max = hi;
    n.greedy = greedy;
    n.kids.push_back(std::move(a));
    (void)depth;
    return n;
  }

  // {n} {n,} {n,m} at i_: advances past it; false (i_ unchanged) when it is not one.
  bool count(int* lo, int* hi) {
    size_t j = i_ + 1;
    auto number = [&](int* v) {
      const size_t s = j;
      int64_t x = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && j - s < 6) x = x * 10 + (p_[j++] - '0');
      if (j == s) return false;
      if (x > kMaxCount) fail("a count above " + std::to_string(kMaxCount), s);
      *v = int(x);
      return true;
    };
    if (!number(lo)) return false;
    *hi = *lo;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(hi)) *hi = -1;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    if (*hi != -1 && *hi < *lo) fail("a count {n,m} with m < n", i_);
    i_ = j + 1;
    return true;
  }

  Node char_node(uint32_t c) {
    Node n;
    if (icase_ && ascii_letter(c)) {
      RangeList r;
      fold_into(r, c);
      n.kind = Node::kClass;
      n.cls = add_class(normalized(std::move(r)));
      return n;
    }
    if (icase_ && c >= 0x80) fail("a non-ASCII character under (?i) (only ASCII letters fold here)", i_);
    n.kind = Node::kChar;
    n.ch = c;
    return n;
  }

  // c and, for an ASCII letter, its other case and the non-ASCII characters that fold to it.
  static void fold_into(RangeList& r, uint32_t c) {
    r.push_back({c, c});
    if (!ascii_letter(c)) return;
    const uint32_t lower = c | 0x20;
    r.push_back({lower, lower});
    r.push_back({lower - 0x20, lower - 0x20});
    if (lower == 's') r.push_back({0x17F, 0x17F});    // LATIN SMALL LETTER LONG S
    if (lower == 'k') r.push_back({0x212A, 0x212A});  // KELVIN SIGN
  }

  int add_class(const RangeList& sorted) {
    classes_.emplace_back(sorted);
    return int(classes_.size() - 1);
  }

  Node class_node(const RangeList& sorted) {
    Node n;
    n.kind = Node::kClass;
    n.cls = add_class(sorted);
    return n;
  }

  Node atom(int depth) {
    const size_t start = i_;
    const char c = p_[i_];
    if (c == '(') return group(depth);
    if (c == '[') return class_node(bracket());
    if (c == '.') {
      ++i_;
      Node n;
      n.kind = Node::kAny;
      return n;
    }
    if (c == '\\') {
      RangeList set;
      uint32_t ch = 0;
      if (escape(false, &set, &ch)) return class_node(set);
      return char_node(ch);
    }
    if (c == '^' || c == '$') fail(std::string("the anchor '") + c + "'", start);
    if (c == '*' || c == '+' || c == '?') fail("a quantifier with nothing to repeat", start);
    if (c == '{') fail("a '{' that is not a count (escape it: \\{)", start);
    return char_node(next_cp());
  }

  Node group(int depth) {
    const size_t start = i_;
    ++i_;  // '('
    const bool saved = icase_;
    const size_t saved_start = group_start_;
    Node inner;
    auto close = [&] {
      if (!at(')')) fail("a '(' without its ')'", start);
      ++i_;
      icase_ = saved;
      group_start_ = saved_start;
    };
    if (!at('?')) {  // a capturing group: nothing is captured here, the match is the same
      group_start_ = i_;
      inner = alternation(depth + 1);
      close();
      return inner;
    }
    ++i_;
    if (at(':')) {
      ++i_;
    } else if (at('=') || at('!')) {
      Node look;
      look.kind = Node::kLook;
      look.negate = at('!');
      ++i_;
      group_start_ = i_;
      look.kids.push_back(alternation(depth + 1));
      close();
      return look;
    } else if (at("i:") || at("-i:")) {
      icase_ = at('i');
      i_ += icase_ ? 2 : 3;
    } else if (at("i)") || at("-i)")) {
      // An isolated flag applies to the rest of its group (Oniguruma reads "a(?i)b|c" as
      // "a(?i:b|c)"): supported where that reading and the plain one agree, at a group's start.
      if (start != group_start_) fail("an isolated (?i) or (?-i) after the start of its group", start);
      icase_ = at('i');
      i_ += icase_ ? 2 : 3;
      return Node{};  // kEmpty: the flag holds until the enclosing group closes
    } else if (at("<=") || at("<!")) {
      fail("a lookbehind", start);
    } else if (at('>')) {
      fail("an atomic group", start);
    } else if (at('<') || at('P') || at('\'')) {
      fail("a named group", start);
    } else if (at('#')) {
      fail("a comment group", start);
    } else {
      fail("the group construct '(?" + std::string(p_.substr(i_, 1)) + "'", start);
    }
    group_start_ = i_;
    inner = alternation(depth + 1);
    close();
    return inner;
  }

  // A hex number of at most `max_digits` digits at i_ (braced: up to the '}').
  uint32_t hex(size_t max_digits, bool braced, size_t start) {
    uint32_t v = 0;
    size_t n = 0;
    while (i_ < p_.size() && n < max_digits && std::isxdigit(static_cast<unsigned char>(p_[i_]))) {
      const char h = p_[i_++];
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++n;
    }
    if (n == 0 || (!braced && n != max_digits) || v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      fail("a malformed hex escape", start);
    if (braced) {
      if (!at('}')) fail("a malformed hex escape", start);
      ++i_;
    }
    return v;
  }

  // The escape at i_ ('\\'): a set (returns true, *set) or one character (false, *ch).
  bool escape(bool in_class, RangeList* set, uint32_t* ch) {
    const size_t start = i_;
    ++i_;
    if (i_ >= p_.size()) fail("a '\\' at the end", start);
    const char e = p_[i_++];
    auto no_icase = [&](const char* what) {
      if (icase_) fail(std::string(what) + " under (?i) (only ASCII letters fold here)", start);
    };
    switch (e) {
      case 's':
      case 'S':
        *set = e == 's' ? space_ranges() : complement(space_ranges());
        return true;
      case 'd':
      case 'D':
        category("Nd", set);
        if (e == 'D') *set = complement(*set);
        return true;
      case 'w':
      case 'W': {
        no_icase("\\w");
        RangeList r;
        for (const char* c : {"L", "M", "N", "Pc"}) {
          RangeList x;
          category(c, &x);
          r.insert(r.end(), x.begin(), x.end());
        }
        *set = normalized(std::move(r));
        if (e == 'W') *set = complement(*set);
        return true;
      }
      case 'p':
      case 'P': {
        bool negate = e == 'P';
        std::string name;
        if (at('{')) {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) fail("a \\p{ without its }", start);
          name = std::string(p_.substr(i_ + 1, close - i_ - 1));
          i_ = close + 1;
          if (!name.empty() && name[0] == '^') {
            negate = !negate;
            name.erase(0, 1);
          }
        } else {
          fail("a \\p or \\P without braces (write \\p{L})", start);
        }
        if (!category(name, set)) fail("the property \\p{" + name + "} (general categories only)", start);
        no_icase("a \\p property");
        if (negate) *set = complement(*set);
        return true;
      }
      case 't':
        *ch = '\t';
        return false;
      case 'n':
        *ch = '\n';
        return false;
      case 'r':
        *ch = '\r';
        return false;
      case 'f':
        *ch = '\f';
        return false;
      case 'v':
        *ch = '\v';
        return false;
      case 'a':
        *ch = 0x07;
        return false;
      case 'e':
        *ch = 0x1B;
        return false;
      case 'x':
        *ch = at('{') ? (++i_, hex(8, true, start)) : hex(2, false, start);
        return false;
      case 'u':
        *ch = hex(4, false, start);
        return false;
      default:
        break;
    }
    const auto u = static_cast<unsigned char>(e);
    if (u >= 0x80 || std::isalnum(u))
      fail(std::string("the escape '\\") + (u >= 0x80 ? "?" : std::string(1, e)) + "'", start);
    (void)in_class;
    *ch = u;  // escaped punctuation stands for itself
    return false;
  }

  // A bracketed class at i_ ('['), as sorted ranges (negation and (?i) applied).
  RangeList bracket() {
    const size_t start = i_;
    ++i_;
    const bool negate = at('^');
    if (negate) ++i_;
    if (at(']')) fail("a ']' first in a class (escape it: \\])", i_);
    RangeList r;
    for (;;) {
      if (i_ >= p_.size()) fail("a '[' without its ']'", start);
      if (at(']')) {
        ++i_;
        break;
      }
      if (at('[')) fail("a nested class", i_);
      if (at("&&")) fail("a class intersection (&&)", i_);
      const size_t item = i_;
      uint32_t lo = 0;
      if (at('\\')) {
        RangeList set;
        if (escape(true, &set, &lo)) {
          r.insert(r.end(), set.begin(), set.end());
          continue;
        }
      } else {
        lo = next_cp();
      }
      uint32_t hi = lo;
      if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (at('[')) fail("a nested class", i_);
        if (at('\\')) {
          RangeList set;
          if (escape(true, &set, &hi)) fail("a range that ends in a set", item);
        } else {
          hi = next_cp();
        }
        if (hi < lo) fail("a range whose end comes before its start", item);
      }
      if (icase_) {
        if (hi >= 0x80) fail("a non-ASCII character under (?i) (only ASCII letters fold here)", item);
        for (uint32_t c = lo; c <= hi; ++c) fold_into(r, c);
      } else {
        r.push_back({lo, hi});
      }
    }
    RangeList sorted = normalized(std::move(r));
    return negate ? complement(sorted) : sorted;
  }

  std::string_view p_;
  size_t i_ = 0;
  bool icase_ = false;
  size_t group_start_ = 0;  // where the innermost open group's contents begin
  std::vector<CharClass>& classes_;
};

}  // namespace

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::kEmpty:
    case Node::kLook:
      return true;
    case Node::kChar:
    case Node::kClass:
    case Node::kAny:
      return false;
    case Node::kCat:
      return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::kAlt:
      return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::kRepeat:
      return n.min == 0 || nullable(n.kids[0]);
  }
  return true;
}

Node parse_regex(std::string_view pattern, std::vector<CharClass>& classes) {
  Parser parser(pattern, classes);
  return parser.parse();
}

}  // namespace troupe::hf::detail
