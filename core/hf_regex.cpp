// A backtracking matcher for the pre-tokenizer regexes (contract in hf_regex.hpp): a parser to
// a tree, a compiler to a small program, and a depth-first executor with an explicit stack.
//
//   program of "\s+(?!\S)":   0 CLASS \s   1 SPLIT 0, 2 ... (the + loops back)   LOOK ! ... MATCH
//
// Each SPLIT knows the first characters each branch can start with (ASCII as a bitmap), so
// that a branch that cannot match the next character is never pushed: at a letter, "'s|'t|..."
// costs one test, and a greedy loop stops without a backtracking entry per character.
#include "core/hf_regex.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"
#include "core/text.hpp"
#include "core/unicode_tables.hpp"

namespace troupe::hf {

namespace {

using unicode::Range;
using RangeList = std::vector<Range>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxProgram = size_t(1) << 14;
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
      {'L', "Lu Ll Lt Lm Lo"}, {'M', "Mn Mc Me"},          {'N', "Nd Nl No"},    {'P', "Pc Pd Ps Pe Pi Pf Po"},
      {'S', "Sm Sc Sk So"},    {'Z', "Zs Zl Zp"},          {'C', "Cc Cf Cs Co Cn"}};
  RangeList r;
  auto add = [&](std::string_view two) {
    if (two != "Cn") {
      append_category(r, two);
      return unicode::category_ranges(two).size > 0;
    }
    RangeList all;  // Cn: what no category holds
    for (const char* c : {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
                          "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"})
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

struct CharClass {
  uint64_t ascii[2] = {0, 0};
  std::vector<Range> high;  // code points >= 0x80, sorted, disjoint

  explicit CharClass(const RangeList& sorted) {
    for (Range x : sorted) {
      for (uint32_t c = x.first; c <= std::min<uint32_t>(x.last, 0x7F); ++c) ascii[c >> 6] |= uint64_t(1) << (c & 63);
      if (x.last >= 0x80) high.push_back({std::max<uint32_t>(x.first, 0x80), x.last});
    }
  }
  bool has(uint32_t c) const {
    if (c < 0x80) return (ascii[c >> 6] >> (c & 63)) & 1;
    auto it = std::upper_bound(high.begin(), high.end(), c, [](uint32_t v, const Range& r) { return v < r.first; });
    return it != high.begin() && c <= (it - 1)->last;
  }
};

// ---------------------------------------------------------------- parsing

struct Node {
  enum Kind { kEmpty, kChar, kClass, kAny, kCat, kAlt, kRepeat, kLook } kind = kEmpty;
  uint32_t ch = 0;
  int cls = -1;
  std::vector<Node> kids;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
  bool greedy = true;
  bool negate = false;  // kLook
};

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
    if (lower == 's') r.push_back({0x17F, 0x17F});  // LATIN SMALL LETTER LONG S
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
      case 't': *ch = '\t'; return false;
      case 'n': *ch = '\n'; return false;
      case 'r': *ch = '\r'; return false;
      case 'f': *ch = '\f'; return false;
      case 'v': *ch = '\v'; return false;
      case 'a': *ch = 0x07; return false;
      case 'e': *ch = 0x1B; return false;
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

// ---------------------------------------------------------------- the program

enum class Op : uint8_t { kChar, kClass, kAny, kSplit, kJmp, kLook, kMatch };

struct Inst {
  Op op;
  uint32_t arg = 0;  // kChar: the code point; kClass: its index; kLook: 1 = negative
  int x = 0, y = 0;  // kSplit: preferred, other; kJmp: x; kLook: sub-program x, continuation y
};

// What a path from an instruction can start with: ASCII characters as a bitmap, whether any
// non-ASCII one, and whether it can succeed without a character.
struct First {
  uint64_t ascii[2] = {0, 0};
  bool high = false;
  bool nullable = false;
};

struct Thread {
  int pc;
  size_t pos;
};

struct Scratch {
  std::vector<Thread> stack;
  uint64_t steps = 0, budget = 0;
};

struct Regex::Impl {
  std::vector<CharClass> classes;
  std::vector<Inst> prog;
  std::vector<First> first;

  int emit(Inst in, const std::string& pattern) {
    if (prog.size() >= kMaxProgram)
      throw Error("regex \"" + sanitize_utf8(pattern, 200) + "\": compiles to more than " +
                  std::to_string(kMaxProgram) + " instructions, more than a pre-tokenizer needs");
    prog.push_back(in);
    return int(prog.size() - 1);
  }

  void gen(const Node& n, const std::string& pat) {
    switch (n.kind) {
      case Node::kEmpty:
        return;
      case Node::kChar:
        emit({Op::kChar, n.ch}, pat);
        return;
      case Node::kClass:
        emit({Op::kClass, uint32_t(n.cls)}, pat);
        return;
      case Node::kAny:
        emit({Op::kAny}, pat);
        return;
      case Node::kCat:
        for (const Node& k : n.kids) gen(k, pat);
        return;
      case Node::kAlt: {
        std::vector<int> to_end;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i + 1 == n.kids.size()) {
            gen(n.kids[i], pat);
            break;
          }
          const int s = emit({Op::kSplit}, pat);
          prog[size_t(s)].x = s + 1;
          gen(n.kids[i], pat);
          to_end.push_back(emit({Op::kJmp}, pat));
          prog[size_t(s)].y = int(prog.size());
        }
        for (int j : to_end) prog[size_t(j)].x = int(prog.size());
        return;
      }
      case Node::kRepeat: {
        const Node& body = n.kids[0];
        for (int i = 0; i < n.min; ++i) gen(body, pat);
        auto branch = [&](int s, int take, int skip) {
          prog[size_t(s)].x = n.greedy ? take : skip;
          prog[size_t(s)].y = n.greedy ? skip : take;
        };
        if (n.max == -1) {  // L: SPLIT body, out; body; JMP L; out:
          const int s = emit({Op::kSplit}, pat);
          gen(body, pat);
          const int j = emit({Op::kJmp}, pat);
          prog[size_t(j)].x = s;
          branch(s, s + 1, int(prog.size()));
          return;
        }
        std::vector<int> splits;  // nested optionals: each skip leaves the whole repetition
        for (int i = n.min; i < n.max; ++i) {
          splits.push_back(emit({Op::kSplit}, pat));
          gen(body, pat);
        }
        for (int s : splits) branch(s, s + 1, int(prog.size()));
        return;
      }
      case Node::kLook: {
        const int l = emit({Op::kLook, n.negate ? 1u : 0u}, pat);
        prog[size_t(l)].x = l + 1;
        gen(n.kids[0], pat);
        emit({Op::kMatch}, pat);
        prog[size_t(l)].y = int(prog.size());
        return;
      }
    }
  }

  const First& first_of(int pc, std::vector<uint8_t>& state) {
    First& f = first[size_t(pc)];
    if (state[size_t(pc)] != 0) return f;  // done, or on the path (an empty cycle adds nothing)
    state[size_t(pc)] = 1;
    const Inst& in = prog[size_t(pc)];
    auto add = [&f](const First& o) {
      f.ascii[0] |= o.ascii[0];
      f.ascii[1] |= o.ascii[1];
      f.high |= o.high;
      f.nullable |= o.nullable;
    };
    switch (in.op) {
      case Op::kChar:
        if (in.arg < 0x80)
          f.ascii[in.arg >> 6] |= uint64_t(1) << (in.arg & 63);
        else
          f.high = true;
        break;
      case Op::kClass:
        f.ascii[0] = classes[in.arg].ascii[0];
        f.ascii[1] = classes[in.arg].ascii[1];
        f.high = !classes[in.arg].high.empty();
        break;
      case Op::kAny:
        f.ascii[0] = ~(uint64_t(1) << '\n');
        f.ascii[1] = ~uint64_t(0);
        f.high = true;
        break;
      case Op::kSplit:
        add(first_of(in.x, state));
        add(first_of(in.y, state));
        break;
      case Op::kJmp:
        add(first_of(in.x, state));
        break;
      case Op::kLook:  // zero width: what follows consumes the first character
        add(first_of(in.y, state));
        break;
      case Op::kMatch:
        f.nullable = true;
        break;
    }
    state[size_t(pc)] = 2;
    return f;
  }

  // Whether a path from pc can start at text[pos]: false only when it certainly cannot.
  bool viable(int pc, const unsigned char* s, size_t n, size_t pos) const {
    const First& f = first[size_t(pc)];
    if (f.nullable) return true;
    if (pos >= n) return false;
    const unsigned c = s[pos];
    return c < 0x80 ? ((f.ascii[c >> 6] >> (c & 63)) & 1) != 0 : f.high;
  }

  // The code point at s[pos] of well-formed UTF-8, and its length.
  static size_t decode(const unsigned char* s, size_t pos, uint32_t* cp) {
    const unsigned c = s[pos];
    if (c < 0x80) {
      *cp = c;
      return 1;
    }
    if (c < 0xE0) {
      *cp = (c & 0x1Fu) << 6 | (s[pos + 1] & 0x3Fu);
      return 2;
    }
    if (c < 0xF0) {
      *cp = (c & 0x0Fu) << 12 | (s[pos + 1] & 0x3Fu) << 6 | (s[pos + 2] & 0x3Fu);
      return 3;
    }
    *cp = (c & 0x07u) << 18 | (s[pos + 1] & 0x3Fu) << 12 | (s[pos + 2] & 0x3Fu) << 6 | (s[pos + 3] & 0x3Fu);
    return 4;
  }

  // Runs the program from pc at pos: true and *end when a path reaches MATCH. Paths are tried
  // depth first, the preferred branch of each SPLIT first: the first MATCH reached is
  // Oniguruma's match.
  bool run(int pc0, const unsigned char* s, size_t n, size_t pos0, size_t* end, Scratch& sc) const {
    const size_t base = sc.stack.size();
    sc.stack.push_back({pc0, pos0});
    while (sc.stack.size() > base) {
      int pc = sc.stack.back().pc;
      size_t pos = sc.stack.back().pos;
      sc.stack.pop_back();
      for (;;) {
        if (++sc.steps > sc.budget)
          throw Error("regex: more than " + std::to_string(sc.budget) +
                      " backtracking steps on one text (a pattern that backtracks exponentially)");
        const Inst& in = prog[size_t(pc)];
        uint32_t c = 0;
        switch (in.op) {
          case Op::kChar:
            if (pos >= n) goto fail;
            pos += decode(s, pos, &c);
            if (c != in.arg) goto fail;
            ++pc;
            continue;
          case Op::kClass:
            if (pos >= n) goto fail;
            pos += decode(s, pos, &c);
            if (!classes[in.arg].has(c)) goto fail;
            ++pc;
            continue;
          case Op::kAny:
            if (pos >= n || s[pos] == '\n') goto fail;
            pos += decode(s, pos, &c);
            ++pc;
            continue;
          case Op::kJmp:
            pc = in.x;
            continue;
          case Op::kSplit: {
            const bool vx = viable(in.x, s, n, pos), vy = viable(in.y, s, n, pos);
            if (vx) {
              if (vy) sc.stack.push_back({in.y, pos});
              pc = in.x;
            } else if (vy) {
              pc = in.y;
            } else {
              goto fail;
            }
            continue;
          }
          case Op::kLook: {
            size_t ignored = 0;
            const bool matched = run(in.x, s, n, pos, &ignored, sc);
            if (matched == (in.arg != 0)) goto fail;
            pc = in.y;
            continue;
          }
          case Op::kMatch:
            sc.stack.resize(base);
            *end = pos;
            return true;
        }
      }
    fail:;
    }
    return false;
  }
};

Regex::Regex(std::string_view pattern) : pattern_(pattern), impl_(new Impl) {
  try {
    Parser parser(pattern, impl_->classes);
    const Node root = parser.parse();
    if (nullable(root))
      throw Error("regex \"" + sanitize_utf8(pattern, 200) +
                  "\": a pattern that can match the empty string is not supported (a split needs non-empty pieces)");
    impl_->gen(root, pattern_);
    impl_->emit({Op::kMatch}, pattern_);
    impl_->first.assign(impl_->prog.size(), First{});
    std::vector<uint8_t> state(impl_->prog.size(), 0);
    for (size_t pc = 0; pc < impl_->prog.size(); ++pc) impl_->first_of(int(pc), state);
  } catch (...) {
    delete impl_;
    throw;
  }
}

Regex::Regex(Regex&& o) noexcept : pattern_(std::move(o.pattern_)), impl_(o.impl_) { o.impl_ = nullptr; }
Regex& Regex::operator=(Regex&& o) noexcept {
  std::swap(pattern_, o.pattern_);
  std::swap(impl_, o.impl_);
  return *this;
}
Regex::~Regex() { delete impl_; }

size_t Regex::program_size() const { return impl_->prog.size(); }

void* Regex::new_scratch(size_t text_bytes) const {
  auto* sc = new Scratch;
  sc->budget = 1000000 + 1024 * uint64_t(text_bytes);
  return sc;
}
void Regex::free_scratch(void* s) { delete static_cast<Scratch*>(s); }

bool Regex::search(std::string_view text, size_t from, size_t* begin, size_t* end, void* scratch) const {
  auto& sc = *static_cast<Scratch*>(scratch);
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t p = from; p < n;) {
    if (impl_->viable(0, s, n, p) && impl_->run(0, s, n, p, end, sc)) {
      *begin = p;
      return true;
    }
    ++sc.steps;
    uint32_t c = 0;
    p += Impl::decode(s, p, &c);
  }
  return false;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  const size_t bad = invalid_utf8_at(text);
  require(bad == std::string_view::npos, "regex: the text is not UTF-8 (byte ", bad, ")");
  std::vector<std::pair<size_t, size_t>> out;
  for_each_match(text, [&](size_t b, size_t e) { out.emplace_back(b, e); });
  return out;
}

}  // namespace troupe::hf
