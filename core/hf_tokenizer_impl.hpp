// The insides of hf::Tokenizer, shared by its reader (hf_tokenizer_load.cpp) and its encoder
// (hf_tokenizer.cpp); not part of the API.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
  std::unordered_map<std::string, uint32_t> vocab;                          // model.vocab
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;      // (a << 32 | b) -> (rank, id)
  std::array<uint32_t, 256> byte_id{};                                     // the token of each byte
  std::array<std::string, 256> byte_utf8;                                  // its character, UTF-8
  bool ignore_merges = false;

  // Every id, model and added: present, its decoded bytes, special or not.
  std::vector<uint8_t> present;
  std::vector<uint8_t> special;
  std::string bytes;
  std::vector<uint64_t> offsets;  // id i is bytes[offsets[i], offsets[i + 1])
  std::unordered_map<std::string, uint32_t> added_ids;  // added token text -> id
  std::vector<AddedToken> added;
  // Pass 0 matches the tokens with "normalized": false, pass 1 the others (the library's two
  // passes); `plain` holds the non-special ones, `all` every one.
  AddedMatcher plain[2], all[2];

  std::optional<uint32_t> bos, eos;
  bool add_bos = true;
};

}  // namespace troupe::hf
