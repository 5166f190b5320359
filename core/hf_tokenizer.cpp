// Encoding and decoding with a Hugging Face byte-level BPE (contract in hf_tokenizer.hpp).
//
//   "Hi <|eot_id|> x" (special)  -> "Hi " | <|eot_id|> | " x"        added tokens cut out
//   "Hi "                        -> "Hi" " "                         the pre-tokenizer's pieces
//   "Hi"                         -> H i -> Hi                        BPE, lowest merge rank first
#include <algorithm>
#include <deque>
#include <functional>

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
template <class Emit>
void apply_behavior(std::string_view text, const std::vector<Span>& marks, Behavior behavior,
                    std::vector<Span>& keep, Emit&& emit) {
  keep.clear();  // match here means "remove"
  switch (behavior) {
    case Behavior::isolated:
      for (Span s : marks)
        if (s.e > s.b) emit(text.substr(s.b, s.e - s.b));
      return;
    case Behavior::removed:
      for (Span s : marks)
        if (!s.match && s.e > s.b) emit(text.substr(s.b, s.e - s.b));
      return;
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
    if (s.e > s.b) emit(text.substr(s.b, s.e - s.b));
}

}  // namespace

// What an Encoder keeps between texts: the ids of each distinct piece, so that " the" is merged
// once (bounded: it starts again past 2^24 ids), and buffers.
struct Encoder::Work {
  std::deque<std::string> arena;  // pieces made (a prepended space), for one text
  BytesMap cache;                 // piece -> (offset, count) in pool
  std::vector<uint32_t> pool;
  std::vector<std::vector<Span>> marks, keep;  // per pre-tokenizer step
  // BPE state of one piece.
  std::vector<uint32_t> sym;
  std::vector<int64_t> prev, nxt;
  std::vector<bool> dead;
  struct Entry {
    uint32_t rank;
    int64_t pos;
    uint32_t id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Entry> heap;  // a min-heap of merges (std::push_heap with greater)
};

uint32_t byte_char(uint8_t b) { return alphabet().to_char[b]; }
int char_byte(uint32_t c) { return c < 0x144 ? alphabet().to_byte[c] : -1; }

namespace {

using Work = Encoder::Work;

// Step k of the pre-tokenizer on one piece: emit(p) for each piece it makes.
template <class Emit>
void split_piece(const PreTokenizer& p, size_t k, std::string_view piece, Work& w, Emit&& emit) {
  if (p.kind == PreTokenizer::Kind::byte_level) {
    if (p.add_prefix_space && piece[0] != ' ') {
      w.arena.push_back(" " + std::string(piece));
      piece = w.arena.back();
    }
    if (!p.regex) return emit(piece);
  }
  std::vector<Span>& marks = w.marks[k];
  marks.clear();
  size_t prev = 0;
  auto mark = [&](size_t b, size_t e) {
    if (b > prev) marks.push_back({prev, b, p.invert});
    marks.push_back({b, e, !p.invert});
    prev = e;
  };
  if (p.kind == PreTokenizer::Kind::split_string) {
    for (size_t at = piece.find(p.literal); at != std::string_view::npos; at = piece.find(p.literal, prev))
      mark(at, at + p.literal.size());
  } else {
    p.regex->for_each_match(piece, mark);
  }
  if (prev < piece.size()) marks.push_back({prev, piece.size(), p.invert});
  apply_behavior(piece, marks, p.behavior, w.keep[k], emit);
}

// BPE of one piece (raw bytes), as the library's Word::merge_all: a min-heap of (rank, position)
// over a linked list of symbols; an entry whose pair has changed since it was pushed is skipped.
void merge_piece(const Tokenizer::Impl& t, std::string_view piece, Work& w, std::vector<uint32_t>& out) {
  if (t.ignore_merges) {
    if (const BytesMap::Value* v = t.vocab_bytes.find(piece)) {
      out.push_back(v->a);
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
  using Entry = Work::Entry;
  std::vector<Entry>& heap = w.heap;
  heap.clear();
  const std::greater<Entry> later;
  auto push = [&](int64_t i) {
    if (i < 0 || w.nxt[size_t(i)] < 0) return;
    if (const PairMap::Merge* m = t.merges.find(w.sym[size_t(i)], w.sym[size_t(w.nxt[size_t(i)])])) {
      heap.push_back({m->rank, i, m->id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int64_t(i));
  w.dead.assign(n, false);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry top = heap.back();
    heap.pop_back();
    const size_t i = size_t(top.pos);
    if (w.dead[i] || w.nxt[i] < 0) continue;
    const size_t j = size_t(w.nxt[i]);
    const PairMap::Merge* m = t.merges.find(w.sym[i], w.sym[j]);
    if (m == nullptr || m->id != top.id) continue;
    w.sym[i] = top.id;
    w.dead[j] = true;
    w.nxt[i] = w.nxt[j];
    if (w.nxt[j] >= 0) w.prev[size_t(w.nxt[j])] = int64_t(i);
    push(w.prev[i]);
    push(int64_t(i));
  }
  for (int64_t i = 0; i >= 0; i = w.nxt[size_t(i)]) out.push_back(w.sym[size_t(i)]);
}

// The ids of one pre-tokenized piece: from the cache, else merged (and cached).
void emit_piece(const Tokenizer::Impl& t, std::string_view piece, Work& w, std::vector<uint32_t>& out) {
  constexpr size_t kMaxCachedIds = size_t(1) << 24;  // then the cache starts again: flat memory
  if (piece.size() == 1) {
    out.push_back(t.byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const BytesMap::Value* v = w.cache.find(piece);
  if (v == nullptr) {
    if (w.pool.size() + piece.size() > kMaxCachedIds || w.cache.arena_bytes() > kMaxCachedIds) {
      w.cache.clear();
      w.pool.clear();
    }
    const size_t start = w.pool.size();
    merge_piece(t, piece, w, w.pool);
    w.cache.put(piece, {uint32_t(start), uint32_t(w.pool.size() - start)});
    v = w.cache.find(piece);
  }
  out.insert(out.end(), w.pool.begin() + v->a, w.pool.begin() + v->a + v->b);
}

// Pre-tokenizer steps k.. on a piece, then BPE: the pieces stream through the steps.
void run_steps(const Tokenizer::Impl& t, size_t k, std::string_view piece, Work& w,
               std::vector<uint32_t>& out) {
  if (k == t.pre.size()) return emit_piece(t, piece, w, out);
  split_piece(t.pre[k], k, piece, w, [&](std::string_view p) { run_steps(t, k + 1, p, w, out); });
}

// A segment with no added token in it.
void encode_segment(const Tokenizer::Impl& t, std::string_view seg, Work& w, std::vector<uint32_t>& out) {
  if (seg.empty()) return;
  w.marks.resize(t.pre.size());
  w.keep.resize(t.pre.size());
  run_steps(t, 0, seg, w, out);
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
  Encoder e(*this);
  std::vector<uint32_t> out;
  e.encode(raw, special, out);
  return out;
}

Encoder::Encoder(const Tokenizer& t) : t_(&t), w_(std::make_unique<Work>()) {}
Encoder::~Encoder() = default;

void Encoder::encode(std::string_view raw, bool special, std::vector<uint32_t>& out) {
  const Tokenizer::Impl& t = *t_->impl_;
  Work& w = *w_;
  std::string fixed;
  std::string_view text = raw;
  if (!valid_utf8(raw)) {
    fixed = replace_invalid_utf8(raw);
    text = fixed;
  }
  out.reserve(out.size() + text.size() / 3);
  w.arena.clear();
  const AddedMatcher* m = special ? t.all : t.plain;
  auto emit = [&](uint32_t id) { out.push_back(id); };
  // Pass 0: the tokens matched on the raw text; pass 1, in what is left: the "normalized"
  // ones (the same text here: no normalizer is read).
  cut_added(
      t, m[0], text,
      [&](std::string_view s) {
        cut_added(
            t, m[1], s, [&](std::string_view x) { encode_segment(t, x, w, out); }, emit);
      },
      emit);
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  require(has_token(id), "token id ", id, " has no token in the tokenizer (vocabulary of ", vocab_size(),
          ")");
  return std::string_view(impl_->bytes)
      .substr(impl_->offsets[id], impl_->offsets[id + 1] - impl_->offsets[id]);
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n, bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    require(has_token(ids[i]), "token id ", ids[i], " at position ", i,
            " has no token in the tokenizer (vocabulary of ", vocab_size(), ")");
    if (skip_special && impl_->special[ids[i]]) continue;
    out += token_bytes(ids[i]);
  }
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  require(valid_utf8(text), "pre_tokenize: the text is not UTF-8");
  const Impl& t = *impl_;
  Work w;
  w.marks.resize(t.pre.size());
  w.keep.resize(t.pre.size());
  std::vector<std::string> out;
  std::function<void(size_t, std::string_view)> step = [&](size_t k, std::string_view piece) {
    if (k < t.pre.size())
      return split_piece(t.pre[k], k, piece, w, [&](std::string_view p) { step(k + 1, p); });
    std::string mapped;
    for (char c : piece) {
      const uint32_t ch = byte_char(static_cast<uint8_t>(c));
      if (ch < 0x80) {
        mapped += char(ch);
      } else {
        mapped += char(0xC0 | (ch >> 6));
        mapped += char(0x80 | (ch & 0x3F));
      }
    }
    out.push_back(std::move(mapped));
  };
  if (!text.empty()) step(0, text);
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
