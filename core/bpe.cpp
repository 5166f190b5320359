#include "core/bpe.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/json_read.hpp"

namespace troupe::bpe {

namespace {

// ---------------------------------------------------------------- pre-tokenizer

enum Class : uint8_t { kLetter, kDigit, kSpace, kOther };

struct ClassTable {
  Class c[256];
  constexpr ClassTable() : c() {
    for (int i = 0; i < 256; ++i) {
      const bool letter = (i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z') || i >= 0x80;
      const bool space = i == ' ' || (i >= '\t' && i <= '\r');
      c[i] = letter ? kLetter : (i >= '0' && i <= '9') ? kDigit : space ? kSpace : kOther;
    }
  }
};
constexpr ClassTable kClasses;

inline Class class_of(char ch) { return kClasses.c[static_cast<uint8_t>(ch)]; }
inline bool leads_on(Class c) { return c == kLetter || c == kOther; }  // may take a leading space

// End of the chunk that starts at s[i] (i < s.size()); see the rules in bpe.hpp. A chunk is
// at most kMaxChunk bytes: text without spaces (CJK, base64, minified code) would otherwise be
// one chunk as long as the file, and training and encoding cost grow with a chunk's length.
size_t chunk_end(std::string_view s, size_t i) {
  const size_t n = std::min(s.size(), i + kMaxChunk);
  if (s[i] == ' ' && i + 1 < n && leads_on(class_of(s[i + 1]))) {
    const Class c = class_of(s[i + 1]);
    size_t j = i + 2;
    while (j < n && class_of(s[j]) == c) ++j;
    return j;
  }
  const Class c = class_of(s[i]);
  size_t j = i + 1;
  while (j < n && class_of(s[j]) == c) ++j;
  // "a   b": the run gives its last space to " b", as a single space before a word would.
  if (c == kSpace && j < n && j - i > 1 && s[j - 1] == ' ' && leads_on(class_of(s[j]))) --j;
  return j;
}

inline uint64_t pair_key(uint32_t a, uint32_t b) { return uint64_t(a) << 32 | b; }

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < text.size();) {
    const size_t j = chunk_end(text, i);
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

// ---------------------------------------------------------------- the tokenizer

Tokenizer::Tokenizer() : Tokenizer(std::vector<Pair>{}) {}

Tokenizer::Tokenizer(std::vector<Pair> merges) : merges_(std::move(merges)) {
  rank_.reserve(merges_.size());
  offsets_.reserve(kFirstMerge + merges_.size() + 1);
  offsets_.push_back(0);
  for (int i = 0; i < 256; ++i) {
    bytes_.push_back(static_cast<char>(i));
    offsets_.push_back(bytes_.size());
  }
  offsets_.push_back(bytes_.size());  // kEot: no bytes
  for (size_t i = 0; i < merges_.size(); ++i) {
    const Pair p = merges_[i];
    rank_.emplace(pair_key(p.a, p.b), uint32_t(i));
    // Appended from offsets, not views: bytes_ may reallocate while it grows.
    const size_t a0 = offsets_[p.a], a1 = offsets_[p.a + 1];
    const size_t b0 = offsets_[p.b], b1 = offsets_[p.b + 1];
    bytes_.append(bytes_, a0, a1 - a0);
    bytes_.append(bytes_, b0, b1 - b0);
    offsets_.push_back(bytes_.size());
  }
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  require(id < uint32_t(vocab_size()), "token id ", id, " is outside the vocabulary of ", vocab_size());
  return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

// Merges by rank, lowest first, which is the order training made them: merging pair r
// only creates pairs with the new id, whose ranks are above r. A heap of (rank, position)
// over a linked list keeps a long chunk (a run of 10^5 spaces) at O(n log n); equal
// ranks pop leftmost first, as training merged occurrences left to right.
void Tokenizer::encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const {
  const size_t n = chunk.size();
  std::vector<uint32_t> sym(n);
  std::vector<int64_t> prev(n), next(n);  // -1: none
  for (size_t i = 0; i < n; ++i) {
    sym[i] = static_cast<uint8_t>(chunk[i]);
    prev[i] = int64_t(i) - 1;
    next[i] = i + 1 < n ? int64_t(i) + 1 : -1;
  }
  using Entry = std::pair<uint32_t, int64_t>;  // (rank, position of the pair's left symbol)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int64_t i) {
    if (i < 0 || next[i] < 0) return;
    auto it = rank_.find(pair_key(sym[i], sym[next[i]]));
    if (it != rank_.end()) heap.emplace(it->second, i);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int64_t(i));
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    // Stale when a neighbour merged first: the pair at i is no longer merge r.
    if (dead[i] || next[i] < 0) continue;
    const Pair p = merges_[r];
    if (sym[i] != p.a || sym[next[i]] != p.b) continue;
    const int64_t j = next[i];
    sym[i] = kFirstMerge + r;
    dead[j] = true;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int64_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  // A cache per call, keyed by views into `text`: a corpus repeats few distinct chunks
  // ("the", " of"), so most chunks cost one lookup. Cleared when it grows past its
  // bound, so memory stays flat on text that never repeats.
  constexpr size_t kMaxCachedIds = size_t(1) << 24;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // -> (offset, count) in pool
  std::vector<uint32_t> pool;
  for (size_t i = 0; i < text.size();) {
    const size_t j = chunk_end(text, i);
    const std::string_view chunk = text.substr(i, j - i);
    i = j;
    if (chunk.size() == 1) {
      out.push_back(static_cast<uint8_t>(chunk[0]));
      continue;
    }
    auto it = cache.find(chunk);
    if (it == cache.end()) {
      if (pool.size() + chunk.size() > kMaxCachedIds) {
        cache.clear();
        pool.clear();
      }
      const size_t start = pool.size();
      encode_chunk(chunk, pool);
      it = cache.emplace(chunk, std::make_pair(uint32_t(start), uint32_t(pool.size() - start))).first;
    }
    out.insert(out.end(), pool.begin() + it->second.first,
               pool.begin() + it->second.first + it->second.second);
  }
  return out;
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n) const {
  std::string out;
  const uint32_t vocab = uint32_t(vocab_size());
  for (size_t i = 0; i < n; ++i) {
    require(ids[i] < vocab, "token id ", ids[i], " at position ", i, " is outside the vocabulary of ", vocab);
    out.append(bytes_, offsets_[ids[i]], offsets_[ids[i] + 1] - offsets_[ids[i]]);
  }
  return out;
}

// ---------------------------------------------------------------- training
//
// The classic incremental algorithm. A corpus has few distinct chunks, so training works
// on those (a word: its symbols and how often the chunk occurs). It keeps the count of
// every adjacent pair over the words, an index pair -> words that held it, and a max-heap
// of (count, pair) with lazy deletion: an old pair's count only falls (only pairs with the
// new id appear), so a popped entry whose count is stale is pushed again with the current
// count, and the first one that is current is the true maximum.

namespace {

struct Word {
  std::vector<uint32_t> sym;
  int64_t count;
};

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // Lower priority: a smaller count, or for equal counts the larger (a, b).
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

}  // namespace

Tokenizer Tokenizer::train(const std::vector<std::string_view>& documents, int64_t vocab_size,
                           const Progress& cb) {
  require(vocab_size >= int64_t(kFirstMerge) && vocab_size <= kMaxVocab, "vocab_size ", vocab_size,
          " is outside [257, 2^24]: 256 bytes and the end-of-text token come first, and a model has at most "
          "2^24 ids");
  const int64_t wanted = vocab_size - int64_t(kFirstMerge);

  std::unordered_map<std::string_view, int64_t> chunk_counts;
  for (std::string_view doc : documents)
    for (size_t i = 0; i < doc.size();) {
      const size_t j = chunk_end(doc, i);
      if (j - i > 1) ++chunk_counts[doc.substr(i, j - i)];  // one byte has no pair
      i = j;
    }
  std::vector<Word> words;
  words.reserve(chunk_counts.size());
  for (const auto& [chunk, count] : chunk_counts) {
    Word w{std::vector<uint32_t>(chunk.size()), count};
    for (size_t i = 0; i < chunk.size(); ++i) w.sym[i] = static_cast<uint8_t>(chunk[i]);
    words.push_back(std::move(w));
  }
  chunk_counts = {};

  std::unordered_map<uint64_t, int64_t> counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // may hold stale or repeated words
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].sym;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      counts[k] += words[w].count;
      auto& list = where[k];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  std::priority_queue<HeapEntry> heap;
  for (const auto& [k, c] : counts) heap.push({c, k});

  std::vector<Pair> merges;
  std::vector<uint32_t> seen(words.size(), 0);  // the merge that last visited the word, + 1
  std::vector<uint32_t> merged;
  std::vector<uint64_t> new_keys;
  while (int64_t(merges.size()) < wanted && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    const auto cit = counts.find(top.key);
    const int64_t current = cit == counts.end() ? 0 : cit->second;
    if (current <= 0) continue;
    if (current != top.count) {
      heap.push({current, top.key});
      continue;
    }
    const uint32_t a = uint32_t(top.key >> 32), b = uint32_t(top.key);
    const uint32_t z = kFirstMerge + uint32_t(merges.size());
    merges.push_back({a, b});
    const uint32_t stamp = uint32_t(merges.size());
    std::vector<uint32_t> holders = std::move(where[top.key]);
    where.erase(top.key);
    new_keys.clear();
    for (uint32_t w : holders) {
      if (seen[w] == stamp) continue;
      seen[w] = stamp;
      Word& word = words[w];
      auto& s = word.sym;
      merged.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(z);
          i += 2;
        } else {
          merged.push_back(s[i++]);
        }
      }
      if (merged.size() == s.size()) continue;  // a stale entry: the pair left this word
      // Take the word's old pairs out and its new ones in: words are short, and this
      // gets "aaaa" -> "zz" (whose neighbours are merged symbols) right without cases.
      for (size_t i = 0; i + 1 < s.size(); ++i) counts[pair_key(s[i], s[i + 1])] -= word.count;
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        const uint64_t k = pair_key(merged[i], merged[i + 1]);
        int64_t& c = counts[k];
        if (merged[i] == z || merged[i + 1] == z) {
          if (c == 0) new_keys.push_back(k);
          auto& list = where[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
        c += word.count;
      }
      s.swap(merged);
    }
    counts.erase(top.key);
    for (uint64_t k : new_keys) heap.push({counts[k], k});
    if (cb && merges.size() % 256 == 0) cb(int64_t(merges.size()), wanted);
  }
  if (cb) cb(int64_t(merges.size()), wanted);
  return Tokenizer(std::move(merges));
}

// ---------------------------------------------------------------- the JSON file

std::string Tokenizer::to_json() const {
  std::string s =
      "{\"type\": \"troupe-bpe\", \"version\": 1, \"vocab_size\": " + std::to_string(vocab_size()) +
      ", \"eot\": " + std::to_string(kEot) + ", \"pretokenizer\": \"" + kPretokenizer + "\",\n \"merges\": [";
  for (size_t i = 0; i < merges_.size(); ++i) {
    s += i ? ",\n  [" : "\n  [";
    s += std::to_string(merges_[i].a) + ", " + std::to_string(merges_[i].b) + "]";
  }
  s += merges_.empty() ? "]}\n" : "\n ]}\n";
  return s;
}

void Tokenizer::save(const std::string& path) const {
  const std::string text = to_json();
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw IoError("cannot write " + tmp + ": " + std::strerror(errno), errno);
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    throw IoError("cannot write " + tmp + ": " + std::strerror(wrote ? errno : err), wrote ? errno : err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(e), e);
  }
}

namespace {

// The deepest nesting of [ and { outside strings: a tokenizer nests 3 deep, and a
// hostile file of 64 MiB of '[' must not reach the parser.

// A JSON value for a message, cut short: a hostile file's values may be megabytes.
std::string brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 60) + "...";
  return s;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = "tokenizer " + path + ": ";
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  require(!ec, where, "cannot read it: ", ec.message());
  require(size <= kMaxFileBytes, where, "the file is ", size, " bytes, more than the ", kMaxFileBytes >> 20,
          " MiB a tokenizer may be");
  std::ifstream in(path, std::ios::binary);
  require(in.good(), where, "cannot open it");
  std::string text(size, '\0');
  in.read(text.data(), std::streamsize(size));
  require(size_t(in.gcount()) == size, where, "cannot read it (it changed while being read)");
  require(json_depth(text) <= 4, where, "nests deeper than a tokenizer does (not a tokenizer file)");

  nlohmann::json j;
  try {
    json_read::Limits limits;
    limits.max_bytes = kMaxFileBytes;
    limits.max_depth = 4;
    j = json_read::parse(text, "", limits);
  } catch (const Error& e) {
    // ": not valid JSON (byte 9): syntax error ..." -> "not JSON (byte 9): syntax error ..."
    std::string why = std::string(e.what()).substr(2);
    if (why.rfind("not valid JSON ", 0) == 0) why = "not JSON " + why.substr(15);
    throw Error(where + why);
  }
  require(j.is_object(), where, "not a JSON object");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    require(key == "type" || key == "version" || key == "vocab_size" || key == "eot" ||
                key == "pretokenizer" || key == "merges",
            where, "unknown key ", brief(key));
  }
  for (const char* key : {"type", "version", "vocab_size", "eot", "pretokenizer", "merges"})
    require(j.contains(key), where, "\"", key, "\" is missing");
  auto as_id = [](const nlohmann::json& v, uint64_t* out) {
    if (!v.is_number_unsigned()) return false;
    *out = v.get<uint64_t>();
    return true;
  };
  require(j["type"].is_string() && j["type"] == "troupe-bpe", where, "type is ", brief(j["type"]),
          ", not \"troupe-bpe\"");
  uint64_t version = 0;
  require(as_id(j["version"], &version) && version == 1, where, "version ", brief(j["version"]),
          " is not supported (this troupe reads version 1)");
  require(j["pretokenizer"].is_string() && j["pretokenizer"] == kPretokenizer, where, "pretokenizer ",
          brief(j["pretokenizer"]), " is unknown (this troupe knows \"", kPretokenizer, "\")");
  uint64_t eot = 0;
  require(as_id(j["eot"], &eot) && eot == kEot, where, "eot is ", brief(j["eot"]), ", must be ", kEot);
  const auto& jm = j["merges"];
  require(jm.is_array(), where, "merges is not an array");

  std::vector<Pair> merges;
  merges.reserve(jm.size());
  std::unordered_map<uint64_t, size_t> first;  // pair -> the merge that made it
  // Token lengths, to refuse merges that double a token again and again (40 merges
  // would spell a terabyte) before the bytes are built.
  std::vector<uint64_t> length(kFirstMerge, 1);
  length[kEot] = 0;
  uint64_t total = 256;
  constexpr uint64_t kMaxTotal = uint64_t(256) << 20;
  for (size_t i = 0; i < jm.size(); ++i) {
    const auto& m = jm[i];
    uint64_t a = 0, b = 0;
    require(m.is_array() && m.size() == 2 && as_id(m[0], &a) && as_id(m[1], &b), where, "merge ", i,
            " is not a pair of ids [a, b]: ", brief(m));
    const uint64_t next_id = kFirstMerge + i;
    for (uint64_t id : {a, b}) {
      require(id < next_id, where, "merge ", i, " uses id ", id, ", which does not exist before it (ids 0..",
              next_id - 1, ")");
      require(id != kEot, where, "merge ", i, " uses the end-of-text id ", kEot);
    }
    const auto [it, fresh] = first.emplace(pair_key(uint32_t(a), uint32_t(b)), i);
    require(fresh, where, "merge ", i, " repeats the pair [", a, ", ", b, "] of merge ", it->second);
    length.push_back(length[a] + length[b]);
    total += length.back();
    require(total <= kMaxTotal, where, "its tokens spell more than ", kMaxTotal >> 20,
            " MiB of bytes in all (merge ", i, ")");
    merges.push_back({uint32_t(a), uint32_t(b)});
  }
  uint64_t vocab = 0;
  require(as_id(j["vocab_size"], &vocab) && vocab == kFirstMerge + merges.size(), where, "vocab_size is ",
          brief(j["vocab_size"]), " but 257 + ", merges.size(), " merges make ", kFirstMerge + merges.size());
  return Tokenizer(std::move(merges));
}

}  // namespace troupe::bpe
