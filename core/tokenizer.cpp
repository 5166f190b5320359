#include "core/tokenizer.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/bpe.hpp"
#include "core/error.hpp"
#include "core/hf_tokenizer.hpp"
#include "core/hostile_file.hpp"

namespace troupe {

namespace {

namespace fs = std::filesystem;

// Writes `text` to path.tmp, then renames it over path.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw IoError("cannot write " + tmp + ": " + std::strerror(errno), errno);
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    throw IoError("cannot write " + tmp + ": " + std::strerror(err), err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(e), e);
  }
}

class TroupeBpe final : public TextTokenizer {
 public:
  explicit TroupeBpe(bpe::Tokenizer t) : t_(std::move(t)) {}
  const char* format() const override { return "troupe-bpe"; }
  uint32_t vocab_size() const override { return uint32_t(t_.vocab_size()); }
  bool has_token(uint32_t id) const override { return id < vocab_size(); }
  bool has_special_tokens() const override { return false; }
  Encode encoder(bool) const override {
    return [this](std::string_view text, std::vector<uint32_t>& out) {
      const std::vector<uint32_t> ids = t_.encode(text);
      out.insert(out.end(), ids.begin(), ids.end());
    };
  }
  std::string decode(const uint32_t* ids, size_t n) const override { return t_.decode(ids, n); }
  std::string_view token_bytes(uint32_t id) const override { return t_.token_bytes(id); }
  std::optional<uint32_t> document_start() const override { return std::nullopt; }
  std::optional<uint32_t> end_of_text() const override { return t_.eot(); }
  bool end_only_between() const override { return true; }
  void save_into(const std::string& dir) const override { t_.save(dir + "/tokenizer.json"); }

 private:
  bpe::Tokenizer t_;
};

class HuggingFace final : public TextTokenizer {
 public:
  HuggingFace(hf::Tokenizer t, std::string json, std::string config)
      : t_(std::move(t)), json_(std::move(json)), config_(std::move(config)) {}
  const char* format() const override { return "huggingface"; }
  uint32_t vocab_size() const override { return t_.vocab_size(); }
  bool has_token(uint32_t id) const override { return t_.has_token(id); }
  bool has_special_tokens() const override { return true; }
  Encode encoder(bool special) const override {
    auto e = std::make_shared<hf::Encoder>(t_);
    return [e, special](std::string_view text, std::vector<uint32_t>& out) { e->encode(text, special, out); };
  }
  std::string decode(const uint32_t* ids, size_t n) const override { return t_.decode(ids, n); }
  std::string_view token_bytes(uint32_t id) const override { return t_.token_bytes(id); }
  std::optional<uint32_t> document_start() const override {
    if (!t_.bos() || !t_.add_bos() || t_.bos() == t_.eos()) return std::nullopt;
    return t_.bos();
  }
  std::optional<uint32_t> end_of_text() const override { return t_.eos(); }
  bool end_only_between() const override { return false; }
  void save_into(const std::string& dir) const override {
    write_file(dir + "/tokenizer.json", json_);
    const std::string cfg = dir + "/tokenizer_config.json";
    if (!config_.empty()) {
      write_file(cfg, config_);
    } else {
      std::error_code ec;
      fs::remove(cfg, ec);  // an earlier run's config must not pass for this tokenizer's
    }
  }

 private:
  hf::Tokenizer t_;
  std::string json_, config_;
};

}  // namespace

std::unique_ptr<TextTokenizer> from_bpe(bpe::Tokenizer t) {
  return std::make_unique<TroupeBpe>(std::move(t));
}

std::vector<uint32_t> TextTokenizer::encode(std::string_view text, bool special) const {
  std::vector<uint32_t> out;
  encoder(special)(text, out);
  return out;
}

std::unique_ptr<TextTokenizer> load_tokenizer(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, bpe::kMaxFileBytes, "tokenizer");
  } catch (const Error& e) {
    throw Error("tokenizer " + std::string(e.what()));
  }
  if (!hf::looks_like_hf_tokenizer(text)) return std::make_unique<TroupeBpe>(bpe::Tokenizer::load(path));
  const std::string cfg_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
  std::string config;
  std::error_code ec;
  if (fs::exists(cfg_path, ec)) {
    try {
      config = read_regular_file(cfg_path, uint64_t(4) << 20, "tokenizer config");
    } catch (const Error& e) {
      throw Error("tokenizer " + std::string(e.what()));
    }
  }
  hf::Tokenizer t = hf::Tokenizer::parse(text, config, "tokenizer " + path);
  return std::make_unique<HuggingFace>(std::move(t), std::move(text), std::move(config));
}

std::vector<uint32_t> encode_documents(const TextTokenizer& tok, const std::vector<std::string>& docs,
                                       bool special, std::vector<size_t>* starts) {
  std::vector<uint32_t> ids;
  const TextTokenizer::Encode enc = tok.encoder(special);
  const std::optional<uint32_t> start = tok.document_start(), end = tok.end_of_text();
  for (size_t d = 0; d < docs.size(); ++d) {
    if (tok.end_only_between() && d && end) ids.push_back(*end);
    if (starts) starts->push_back(ids.size());
    if (start) ids.push_back(*start);
    enc(docs[d], ids);
    if (!tok.end_only_between() && end) ids.push_back(*end);
  }
  return ids;
}

}  // namespace troupe
