// Hugging Face tokenizer.json files of byte-level BPE models (GPT-2, Llama 3, GPT-4o and the
// like): the ids the `tokenizers` library gives for encode(text, add_special_tokens=False), and
// its ByteLevel decoding. docs/training.md ("Hugging Face tokenizers") says what is read.
//
// Encoding a text:
//   1. Added tokens are cut out of the text first and become their own ids, never split: those
//      with "special": false always (as the library does), the special ones ("<|eot_id|>") only
//      when the caller asks (`special`); otherwise a special token's text is ordinary text.
//   2. Each remaining segment goes through the pre-tokenizer: Split (a regex of core/hf_regex.hpp
//      or a literal string, any of the five behaviours, inverted or not), ByteLevel (optionally
//      with a space prepended and GPT-2's regex split), or a Sequence of them.
//   3. Each piece, as GPT-2's byte-to-character alphabet, is merged by BPE: the pair of lowest
//      merge rank first, the leftmost of equal ranks (the library's order); with ignore_merges a
//      piece that is a vocabulary token whole is that token.
// Text that is not UTF-8 (the library takes only strings) is first made UTF-8 as Python's
// bytes.decode("utf-8", errors="replace") makes it: each maximal ill-formed subpart becomes
// U+FFFD (core/text.hpp replace_invalid_utf8).
//
// Anything else a file may say (another model type, a normalizer, another pre-tokenizer or
// decoder, BPE dropout, a subword prefix, an added token that strips whitespace) is refused by
// name and JSON path: "tokenizer F: normalizer: type \"NFC\" is not supported (...)".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::hf {

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json of at most 64 MiB) and, when it lies beside it,
  // tokenizer_config.json (its bos_token, eos_token and add_bos_token). Throws troupe::Error
  // "tokenizer PATH: JSON.PATH: what is wrong" for anything it does not read faithfully.
  static Tokenizer load(const std::string& path);
  // The same from the texts of the two files; `where` names them in messages; an empty
  // config_text means no tokenizer_config.json.
  static Tokenizer parse(std::string_view json_text, std::string_view config_text, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text` (any bytes; see the file comment). Safe to call from several threads.
  std::vector<uint32_t> encode(std::string_view text, bool special = false) const;
  // The bytes of ids[0..n): each token's characters mapped back to bytes through the ByteLevel
  // alphabet (a token with characters outside it gives its UTF-8 as is, as the library's
  // decoder does); special tokens give their text unless skip_special. Throws troupe::Error
  // for an id that has no token. The bytes may not be UTF-8 when a character is cut between
  // tokens; the library would replace such bytes with U+FFFD, troupe hands them on unchanged.
  std::string decode(const uint32_t* ids, size_t n, bool skip_special = false) const;
  std::string_view token_bytes(uint32_t id) const;  // throws troupe::Error for an id without a token
  // The pieces the pre-tokenizer cuts `text` (UTF-8) into, each in the ByteLevel alphabet
  // ("Ġworld"): what the library's pre_tokenize_str shows, for tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  uint32_t vocab_size() const;  // the largest id + 1
  bool has_token(uint32_t id) const;
  bool is_special(uint32_t id) const;
  std::optional<uint32_t> token_id(std::string_view token) const;  // by its text in the file
  // From tokenizer_config.json: the begin- and end-of-text tokens, and whether a document
  // starts with bos (add_bos_token, true unless the file says false).
  std::optional<uint32_t> bos() const;
  std::optional<uint32_t> eos() const;
  bool add_bos() const;

  struct Impl;

 private:
  friend class Encoder;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Encodes text after text with one tokenizer, remembering the ids of the pieces it has seen
// (a corpus repeats few distinct words): the same ids as Tokenizer::encode, faster. One thread
// at a time; the tokenizer must outlive it.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& t);
  ~Encoder();
  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, bool special, std::vector<uint32_t>& out);

  struct Work;

 private:
  const Tokenizer* t_;
  std::unique_ptr<Work> w_;
};

// Whether `json_text` looks like a Hugging Face tokenizer.json (an object with a "model"
// object), to tell it from troupe's own tokenizer format.
bool looks_like_hf_tokenizer(std::string_view json_text);

}  // namespace troupe::hf
