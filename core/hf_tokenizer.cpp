// Encoding and decoding with a Hugging Face byte-level BPE (contract in hf_tokenizer.hpp).
//
//   "Hi <|eot_id|> x" (special)  -> "Hi " | <|eot_id|> | " x"        added tokens cut out
//   "Hi "                        -> "Hi" " "                         the pre-tokenizer's pieces
//   "Hi"                         -> H i -> Hi                        BPE, lowest merge rank first
#include <algorithm>
#include <deque>
#include <queue>

#include "core/error.hpp"
#include "core/hf_tokenizer_impl.hpp"
#include "core/text.hpp"

namespace troupe::hf {

namespace {

struct Alphabet {
  uint32_t to_char[256];
  int16_t to_byte[0x144];
  Alphabet() {
    std::fill(std::begin(to_byte), std::end(to_byte), int16_t(-1));
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? uint32_t(b) : 0x100 + extra++;
      to_byte[to_char[b]] = int16_t(b);
    }
  }
};
const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

using Behavior = PreTokenizer::Behavior;

// A split's pieces as the library makes them: `marks` is the text cut into matches and the
// gaps between them (is_match, inverted when asked); the behaviour decides what is kept and what
// is joined. Empty pieces are dropped.
struct Span {
  size_t b, e;
  bool match;
};
void apply_behavior(std::string_view text, std::vector<Span>& marks, Behavior behavior,
                    std::vector<std::string_view>& out) {
  std::vector<Span> keep;  // match here means "remove"
  switch (behavior) {
    case Behavior::isolated:
      for (Span s : marks) keep.push_back({s.b, s.e, false});
      break;
    case Behavior::removed:
      keep = marks;
      break;
    case Behavior::merged_with_previous: {
      bool prev = false;
      for (Span s : marks) {
        if (s.match && !prev && !keep.empty())
          keep.back().e = s.e;
        else
          keep.push_back({s.b, s.e, false});
        prev = s.match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool prev = false;
      for (size_t i = marks.size(); i-- > 0;) {
        const Span s = marks[i];
        if (s.match && !prev && !keep.empty())
          keep.back().b = s.b;
        else
          keep.push_back({s.b, s.e, false});
        prev = s.match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
    case Behavior::contiguous: {
      bool prev = false;
      for (Span s : marks) {
        if (s.match == prev && !keep.empty())
          keep.back().e = s.e;
        else
          keep.push_back({s.b, s.e, false});
        prev = s.match;
      }
      break;
    }
  }
  for (Span s : keep)
    if (!s.match && s.e > s.b) out.push_back(text.substr(s.b, s.e - s.b));
}

// What one encode call keeps: pieces of text it made (a prepended space), and the ids of each
// distinct piece, so that "the" is merged once per call.
struct Work {
  std::deque<std::string> arena;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // piece -> (offset, count)
  std::vector<uint32_t> pool;
  std::vector<Span> marks;
  std::vector<std::string_view> pieces, next;
  std::string mapped;
  // BPE state of one piece.
  std::vector<uint32_t> sym;
  std::vector<int64_t> prev, nxt;
};

}  // namespace

uint32_t byte_char(uint8_t b) { return alphabet().to_char[b]; }
int char_byte(uint32_t c) { return c < 0x144 ? alphabet().to_byte[c] : -1; }

namespace {

void split_piece(const PreTokenizer& p, std::string_view piece, Work& w, std::vector<std::string_view>& out) {
  if (p.kind == PreTokenizer::Kind::byte_level) {
    if (p.add_prefix_space && piece[0] != ' ') {
      w.arena.push_back(" " + std::string(piece));
      piece = w.arena.back();
    }
    if (!p.regex) {
      out.push_back(piece);
      return;
    }
  }
  w.marks.clear();
  size_t prev = 0;
  auto mark = [&](size_t b, size_t e) {
    if (b > prev) w.marks.push_back({prev, b, p.invert});
    w.marks.push_back({b, e, !p.invert});
    prev = e;
  };
  if (p.kind == PreTokenizer::Kind::split_string) {
    for (size_t at = piece.find(p.literal); at != std::string_view::npos; at = piece.find(p.literal, prev))
      mark(at, at + p.literal.size());
  } else {
    p.regex->for_each_match(piece, mark);
  }
  if (prev < piece.size()) w.marks.push_back({prev, piece.size(), p.invert});
  apply_behavior(piece, w.marks, p.behavior, out);
}

// BPE of one piece (raw bytes), as the library's Word::merge_all: a min-heap of (rank, position)
// over a linked list of symbols; an entry whose pair has changed since it was pushed is skipped.
void merge_piece(const Tokenizer::Impl& t, std::string_view piece, Work& w, std::vector<uint32_t>& out) {
  if (t.ignore_merges) {
    w.mapped.clear();
    for (char c : piece) w.mapped += t.byte_utf8[static_cast<unsigned char>(c)];
    auto it = t.vocab.find(w.mapped);
    if (it != t.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const size_t n = piece.size();
  w.sym.resize(n);
  w.prev.resize(n);
  w.nxt.resize(n);
  for (size_t i = 0; i < n; ++i) {
    w.sym[i] = t.byte_id[static_cast<unsigned char>(piece[i])];
    w.prev[i] = int64_t(i) - 1;
    w.nxt[i] = i + 1 < n ? int64_t(i) + 1 : -1;
  }
  struct Entry {
    uint32_t rank;
    int64_t pos;
    uint32_t id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int64_t i) {
    if (i < 0 || w.nxt[size_t(i)] < 0) return;
    auto it = t.merges.find(uint64_t(w.sym[size_t(i)]) << 32 | w.sym[size_t(w.nxt[size_t(i)])]);
    if (it != t.merges.end()) heap.push({it->second.first, i, it->second.second});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int64_t(i));
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const size_t i = size_t(top.pos);
    if (dead[i] || w.nxt[i] < 0) continue;
    const size_t j = size_t(w.nxt[i]);
    auto it = t.merges.find(uint64_t(w.sym[i]) << 32 | w.sym[j]);
    if (it == t.merges.end() || it->second.second != top.id) continue;
    w.sym[i] = top.id;
    dead[j] = true;
    w.nxt[i] = w.nxt[j];
    if (w.nxt[j] >= 0) w.prev[size_t(w.nxt[j])] = int64_t(i);
    push(w.prev[i]);
    push(int64_t(i));
  }
  for (int64_t i = 0; i >= 0; i = w.nxt[size_t(i)]) out.push_back(w.sym[size_t(i)]);
}

// A segment with no added token in it: pre-tokenized, each piece merged (once per call).
void encode_segment(const Tokenizer::Impl& t, std::string_view seg, Work& w, std::vector<uint32_t>& out) {
  if (seg.empty()) return;
  w.pieces.assign(1, seg);
  for (const PreTokenizer& p : t.pre) {
    w.next.clear();
    for (std::string_view piece : w.pieces) split_piece(p, piece, w, w.next);
    w.pieces.swap(w.next);
  }
  constexpr size_t kMaxCachedIds = size_t(1) << 24;  // then the cache starts again: flat memory
  for (std::string_view piece : w.pieces) {
    if (piece.size() == 1) {
      out.push_back(t.byte_id[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    auto it = w.cache.find(piece);
    if (it == w.cache.end()) {
      if (w.pool.size() + piece.size() > kMaxCachedIds) {
        w.cache.clear();
        w.pool.clear();
      }
      const size_t start = w.pool.size();
      merge_piece(t, piece, w, w.pool);
      it = w.cache.emplace(piece, std::make_pair(uint32_t(start), uint32_t(w.pool.size() - start))).first;
    }
    out.insert(out.end(), w.pool.begin() + it->second.first, w.pool.begin() + it->second.first + it->second.second);
  }
}

// Cuts the added tokens of `m` out of `text` (leftmost-longest); calls seg(text) for the text
// between them and tok(id) for each token.
template <class Seg, class Tok>
void cut_added(const Tokenizer::Impl& t, const AddedMatcher& m, std::string_view text, Seg&& seg, Tok&& tok) {
  if (m.empty) return seg(text);
  size_t from = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& cands = m.by_first[static_cast<unsigned char>(text[i])];
    for (uint32_t k : cands) {
      const std::string& c = t.added[k].content;
      if (text.compare(i, c.size(), c) != 0) continue;
      seg(text.substr(from, i - from));
      tok(t.added[k].id);
      from = i + c.size();
      i = from - 1;
      break;
    }
  }
  seg(text.substr(from));
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view raw, bool special) const {
  const Impl& t = *impl_;
  std::string fixed;
  std::string_view text = raw;
  if (!valid_utf8(raw)) {
    fixed = replace_invalid_utf8(raw);
    text = fixed;
  }
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  Work w;
  const AddedMatcher* m = special ? t.all : t.plain;
  auto emit = [&](uint32_t id) { out.push_back(id); };
  // Pass 0: the tokens matched on the raw text; pass 1, in what is left: the "normalized"
  // ones (the same text here: no normalizer is read).
  cut_added(
      t, m[0], text,
      [&](std::string_view s) { cut_added(t, m[1], s, [&](std::string_view x) { encode_segment(t, x, w, out); }, emit); },
      emit);
  return out;
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  require(has_token(id), "token id ", id, " has no token in the tokenizer (vocabulary of ", vocab_size(), ")");
  return std::string_view(impl_->bytes).substr(impl_->offsets[id], impl_->offsets[id + 1] - impl_->offsets[id]);
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n, bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    require(has_token(ids[i]), "token id ", ids[i], " at position ", i, " has no token in the tokenizer (vocabulary of ",
            vocab_size(), ")");
    if (skip_special && impl_->special[ids[i]]) continue;
    out += token_bytes(ids[i]);
  }
  return out;
}

uint32_t Tokenizer::vocab_size() const { return uint32_t(impl_->present.size()); }
bool Tokenizer::has_token(uint32_t id) const { return id < impl_->present.size() && impl_->present[id]; }
bool Tokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id]; }
std::optional<uint32_t> Tokenizer::bos() const { return impl_->bos; }
std::optional<uint32_t> Tokenizer::eos() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

std::optional<uint32_t> Tokenizer::token_id(std::string_view token) const {
  auto a = impl_->added_ids.find(std::string(token));
  if (a != impl_->added_ids.end()) return a->second;
  auto v = impl_->vocab.find(std::string(token));
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

}  // namespace troupe::hf
