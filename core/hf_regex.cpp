// A backtracking matcher for the pre-tokenizer regexes (contract in hf_regex.hpp): the parser's
// tree (hf_regex_parse.cpp) compiled to a small program, run by a depth-first executor with an
// explicit stack.
//
//   program of "\s+(?!\S)":   0 CLASS \s   1 SPLIT 0, 2 ... (the + loops back)   LOOK ! ... MATCH
//
// Each SPLIT knows the first characters each branch can start with (ASCII as a bitmap), so
// that a branch that cannot match the next character is never pushed: at a letter, "'s|'t|..."
// costs one test, and a greedy loop stops without a backtracking entry per character.
#include "core/hf_regex.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/hf_regex_internal.hpp"
#include "core/text.hpp"

namespace troupe::hf {

using namespace detail;

namespace {

constexpr size_t kMaxProgram = size_t(1) << 14;

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
    const Node root = parse_regex(pattern, impl_->classes);
    if (nullable(root))
      throw Error(
          "regex \"" + sanitize_utf8(pattern, 200) +
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
