// The insides of hf::Tokenizer, shared by its reader (hf_tokenizer_load.cpp) and its encoder
// (hf_tokenizer.cpp); not part of the API.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/hf_regex.hpp"
#include "core/hf_tokenizer.hpp"

namespace troupe::hf {

// GPT-2's alphabet: byte b stands for the character U+b when b is printable Latin-1 ('!'..'~',
// U+00A1..U+00AC, U+00AE..U+00FF), else for U+0100 + k, the k-th of the other bytes in order
// (the space 0x20 is 'Ġ' U+0120, '\n' is 'Ċ' U+010A).
uint32_t byte_char(uint8_t b);
// The byte a character of the alphabet stands for; -1 for any other character.
int char_byte(uint32_t c);

// Open-addressing hash maps for the hot lookups (a piece's ids, a pair's merge): std's
// node-based maps spend most of an encode in their buckets.
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}
inline uint64_t hash_u64(uint64_t x) {
  x = (x ^ (x >> 33)) * 0xFF51AFD7ED558CCDull;
  x = (x ^ (x >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return x ^ (x >> 33);
}

// Byte strings -> two uint32 values. A key of at most 8 bytes (most pieces of text) is kept in
// its slot, a longer one in the map's arena: a lookup touches one cache line.
class BytesMap {
 public:
  struct Value {
    uint32_t a = 0, b = 0;
  };
  // The value of `key`, or nullptr.
  const Value* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const uint64_t h = hash_bytes(key.data(), key.size());
    const uint64_t packed = pack(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == h && same(s, key, packed)) return &s.value;
    }
  }
  // Inserts (or overwrites) key -> v.
  void put(std::string_view key, Value v) {
    if ((count_ + 1) * 4 > slots_.size() * 3) grow();
    const uint64_t h = hash_bytes(key.data(), key.size());
    const uint64_t packed = pack(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = {h, key.size() <= 8 ? packed : uint64_t(arena_.size()), uint32_t(key.size()), v};
        if (key.size() > 8) arena_.append(key);
        ++count_;
        return;
      }
      if (s.hash == h && same(s, key, packed)) {
        s.value = v;
        return;
      }
    }
  }
  size_t size() const { return count_; }
  size_t arena_bytes() const { return arena_.size(); }
  void clear() {
    slots_.clear();
    arena_.clear();
    count_ = 0;
    mask_ = 0;
  }

 private:
  static constexpr uint32_t kEmpty = ~uint32_t(0);
  struct Slot {
    uint64_t hash = 0;
    uint64_t key = 0;  // the bytes (len <= 8), else the offset in arena_
    uint32_t len = kEmpty;
    Value value;
  };
  static uint64_t pack(std::string_view key) {
    uint64_t v = 0;
    if (key.size() <= 8) std::memcpy(&v, key.data(), key.size());
    return v;
  }
  bool same(const Slot& s, std::string_view key, uint64_t packed) const {
    if (s.len != key.size()) return false;
    if (key.size() <= 8) return s.key == packed;
    return std::memcmp(arena_.data() + s.key, key.data(), key.size()) == 0;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t count_ = 0, mask_ = 0;
};

// (a, b) token pairs -> (merge rank, merged id).
class PairMap {
 public:
  struct Merge {
    uint32_t rank, id;
  };
  void reserve(size_t n) {
    size_t cap = 1024;
    while (cap * 3 < n * 4 + 4) cap *= 2;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Merge{0, 0});
    mask_ = cap - 1;
  }
  // Inserts or overwrites; reserve() must have room for every key.
  void put(uint32_t a, uint32_t b, Merge m) {
    const uint64_t k = uint64_t(a) << 32 | b;
    for (size_t i = hash_u64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty || keys_[i] == k) {
        keys_[i] = k;
        vals_[i] = m;
        return;
      }
    }
  }
  const Merge* find(uint32_t a, uint32_t b) const {
    const uint64_t k = uint64_t(a) << 32 | b;
    for (size_t i = hash_u64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are below 2^24: never a key
  std::vector<uint64_t> keys_;
  std::vector<Merge> vals_;
  size_t mask_ = 0;
};

struct PreTokenizer {
  enum class Kind { split_regex, split_string, byte_level } kind = Kind::split_regex;
  enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
  std::shared_ptr<const Regex> regex;  // split_regex; byte_level with use_regex: GPT-2's pattern
  std::string literal;                 // split_string
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // byte_level
};

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool normalized = false;
};

// Added tokens of one matching pass, by first byte, longest first: the library matches them
// leftmost-longest.
struct AddedMatcher {
  std::array<std::vector<uint32_t>, 256> by_first;  // indices into Impl::added
  bool empty = true;
};

struct Tokenizer::Impl {
  std::vector<PreTokenizer> pre;  // a Sequence flattened, in order

  // The BPE model.
  std::unordered_map<std::string, uint32_t> vocab;  // model.vocab
  BytesMap vocab_bytes;  // a model token's bytes (its characters mapped back) -> (id, 0), for ignore_merges
  PairMap merges;
  std::array<uint32_t, 256> byte_id{};  // the token of each byte
  bool ignore_merges = false;

  // Every id, model and added: present, its decoded bytes, special or not.
  std::vector<uint8_t> present;
  std::vector<uint8_t> special;
  std::string bytes;
  std::vector<uint64_t> offsets;                        // id i is bytes[offsets[i], offsets[i + 1])
  std::unordered_map<std::string, uint32_t> added_ids;  // added token text -> id
  std::vector<AddedToken> added;
  // Pass 0 matches the tokens with "normalized": false, pass 1 the others (the library's two
  // passes); `plain` holds the non-special ones, `all` every one.
  AddedMatcher plain[2], all[2];

  std::optional<uint32_t> bos, eos;
  bool add_bos = true;
};

}  // namespace troupe::hf
