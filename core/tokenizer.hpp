// The tokenizers troupe's commands read (`troupe data`, `troupe sample`, data.tokenizer), behind
// one interface: troupe's own byte-level BPE JSON (core/bpe.hpp) or a Hugging Face
// tokenizer.json (core/hf_tokenizer.hpp), told apart by their contents.
//
// Documents in token data are framed as each format's models expect:
//   troupe-bpe:   doc1 <eot> doc2 <eot> doc3              (end-of-text between documents)
//   huggingface:  <bos> doc1 <eos> <bos> doc2 <eos> ...   (bos when tokenizer_config.json names
//                 one that differs from eos and add_bos_token is not false; eos when it names one)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

namespace bpe {
class Tokenizer;
}

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  // "troupe-bpe" or "huggingface".
  virtual const char* format() const = 0;
  virtual uint32_t vocab_size() const = 0;  // every id is below it
  virtual bool has_token(uint32_t id) const = 0;
  // Whether text may hold special tokens written out ("<|eot_id|>"): only Hugging Face files.
  virtual bool has_special_tokens() const = 0;

  // Appends the ids of one text to `out`; called for text after text, it remembers what it
  // has merged. `special`: special tokens written in the text become their ids. One thread.
  using Encode = std::function<void(std::string_view text, std::vector<uint32_t>& out)>;
  virtual Encode encoder(bool special) const = 0;
  std::vector<uint32_t> encode(std::string_view text, bool special = false) const;

  // The bytes of ids (troupe's end-of-text gives none; a Hugging Face special token its text);
  // troupe::Error for an id without a token.
  virtual std::string decode(const uint32_t* ids, size_t n) const = 0;
  virtual std::string_view token_bytes(uint32_t id) const = 0;

  // Framing (see the file comment): the id that starts each document, the one that ends it,
  // and whether the end id only separates documents (troupe-bpe) rather than ending each.
  virtual std::optional<uint32_t> document_start() const = 0;
  virtual std::optional<uint32_t> end_of_text() const = 0;
  virtual bool end_only_between() const = 0;

  // Writes the tokenizer into `dir` as tokenizer.json (a Hugging Face one also its
  // tokenizer_config.json), each file through a temporary name and a rename.
  virtual void save_into(const std::string& dir) const = 0;
};

// Reads `path`: a Hugging Face tokenizer.json (an object with a "model"; its
// tokenizer_config.json beside it is read too) or troupe's BPE JSON. Throws troupe::Error
// "tokenizer PATH: ..." naming what is wrong or not supported.
std::unique_ptr<TextTokenizer> load_tokenizer(const std::string& path);
// A BPE of troupe's own (one `troupe data tokenize` trained) behind the interface.
std::unique_ptr<TextTokenizer> from_bpe(bpe::Tokenizer t);

// The ids of documents framed for token data (see the file comment); starts[i], when given,
// receives where document i's ids begin.
std::vector<uint32_t> encode_documents(const TextTokenizer& tok, const std::vector<std::string>& docs,
                                       bool special, std::vector<size_t>* starts = nullptr);

}  // namespace troupe
