// The regular expressions of Hugging Face pre-tokenizers (GPT-2's, Llama 3's, o200k's `Split`
// patterns), matched as Oniguruma matches them (what the `tokenizers` library runs): a
// backtracking matcher over UTF-8 code points whose alternatives are tried left to right
// (leftmost-first), greedy quantifiers backtracking one character at a time.
//
// Supported, and nothing else (any other construct is refused by name and offset):
//   literals, escapes \t \n \r \f \v \a \e \xHH \x{H..} \uHHHH and escaped punctuation;
//   .  (any character but \n);
//   classes [...] [^...] with ranges, \p{..} \P{..} \p{^..} (general categories: L, Lu, Ll, Lt, Lm,
//   Lo, M, Mn, Mc, Me, N, Nd, Nl, No, P.., S.., Z.., C.., one or two letters, and the long
//   names Letter, Mark, Number, Punctuation, Symbol, Separator, Other), \s \S (White_Space:
//   U+0009..U+000D, U+0085, Zs, Zl, Zp), \d \D (Nd), \w \W (L, M, N, Pc);
//   groups ( ) (?: ) — nothing is captured —, (?i: ) (?-i: ) (?i) (?-i), lookahead (?= ) (?! );
//   quantifiers ? * + {n} {n,} {n,m}, greedy or lazy (a trailing ?);
//   alternation |.
// Under (?i) only ASCII letters fold (with U+017F to s and U+212A to k, Unicode's simple case
// folding of the two non-ASCII characters that fold to ASCII); a non-ASCII literal or a cased
// category there is refused rather than folded wrongly.
//
// Refused: anchors, backreferences, lookbehind, atomic and named groups, possessive quantifiers,
// word boundaries, a repetition of something that can match the empty string, and a pattern
// that can match the empty string (a split needs its pieces to be non-empty).
//
// Character classes come from core/unicode_tables.cpp (Unicode 14.0): a character assigned in a
// later version is unassigned (Cn) here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::hf {

class Regex {
 public:
  // Compiles `pattern` (UTF-8). Throws troupe::Error "regex ...: <construct> at offset N is not
  // supported" / "... is not a valid pattern" naming what it cannot match faithfully.
  explicit Regex(std::string_view pattern);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // The non-overlapping matches of the pattern in `text`, leftmost first, as byte ranges
  // [begin, end) (never empty). `text` must be well-formed UTF-8 (troupe::Error otherwise).
  // Backtracking is bounded: a search that takes more than 10^6 + 1024 steps per byte of text
  // (a pattern with exponential behaviour) throws troupe::Error rather than running for hours.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // As find_all, calling f(begin, end) for each match; `text` is trusted to be valid UTF-8.
  template <class F>
  void for_each_match(std::string_view text, F&& f) const;

  const std::string& pattern() const { return pattern_; }
  size_t program_size() const;

  struct Impl;

 private:
  // The first match at or after `from`; false when there is none.
  bool search(std::string_view text, size_t from, size_t* begin, size_t* end, void* scratch) const;
  void* new_scratch(size_t text_bytes) const;
  static void free_scratch(void* s);

  std::string pattern_;
  Impl* impl_ = nullptr;
};

template <class F>
void Regex::for_each_match(std::string_view text, F&& f) const {
  void* scratch = new_scratch(text.size());
  struct Free {
    void* s;
    ~Free() { Regex::free_scratch(s); }
  } guard{scratch};
  size_t from = 0, b = 0, e = 0;
  while (from < text.size() && search(text, from, &b, &e, scratch)) {
    f(b, e);
    from = e;
  }
}

}  // namespace troupe::hf
