// Reading a tokenizer.json (and tokenizer_config.json): every key is checked, and what troupe
// cannot encode exactly as the `tokenizers` library does is refused by name and JSON path.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/hf_tokenizer_impl.hpp"
#include "core/hostile_file.hpp"
#include "core/text.hpp"

namespace troupe::hf {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxFileBytes = uint64_t(64) << 20;
constexpr uint64_t kMaxConfigBytes = uint64_t(4) << 20;
constexpr uint32_t kMaxId = (uint32_t(1) << 24) - 1;  // as model.vocab_size
// [ and { nest 6 deep in the files of released models (post_processor's special_tokens).
constexpr int kMaxDepth = 16;
constexpr size_t kMaxIdGap = 65536;  // ids beyond the tokens' count (a vocabulary's gaps)
constexpr size_t kMaxSteps = 64;     // pre-tokenizer steps, a Sequence flattened

// The `tokenizers` library's ByteLevel pre-tokenizer regex (use_regex: true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string brief(const json& v) {
  std::string s = json_text(v);
  if (s.size() > 80) s = s.substr(0, 80) + "...";
  return s;
}

// Reads one file's JSON values, naming the file and the JSON path of anything it refuses.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(where_ + ": " + path + ": " + what);
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "is " + brief(v) + ", not an object");
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "is " + brief(v) + ", not an array");
    return v;
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "is " + brief(v) + ", not a string");
    return v.get<std::string>();
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "is " + brief(v) + ", not true or false");
    return v.get<bool>();
  }
  uint32_t id(const json& v, const std::string& path) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > kMaxId)
      fail(path, "is " + brief(v) + ", not a token id in [0, 2^24)");
    return uint32_t(v.get<uint64_t>());
  }
  // Keys of `obj` outside `known` are refused: an unknown key may change what the library does.
  void only(const json& obj, const std::string& path, std::initializer_list<const char*> known) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const bool ok = std::any_of(known.begin(), known.end(), [&](const char* k) { return it.key() == k; });
      if (!ok)
        fail(child(path, it.key()), "is not a key this troupe reads (an unknown setting is not guessed)");
    }
  }
  static std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  // A flag that must have one value (absent or null also meaning `dflt`).
  void flag(const json& obj, const std::string& path, const char* key, bool dflt, bool required,
            const std::string& why) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return;
    if (boolean(*it, child(path, key)) != required)
      fail(child(path, key), std::string("is ") + (required ? "false" : "true") + ": " + why);
    (void)dflt;
  }

 private:
  std::string where_;
};

std::string type_of(const Reader& r, const json& v, const std::string& path) {
  r.object(v, path);
  auto t = v.find("type");
  if (t == v.end()) r.fail(path, "has no \"type\"");
  return r.string(*t, path + ".type");
}

PreTokenizer::Behavior behavior_of(const Reader& r, const json& v, const std::string& path) {
  const std::string b = r.string(v, path);
  using B = PreTokenizer::Behavior;
  if (b == "Removed") return B::removed;
  if (b == "Isolated") return B::isolated;
  if (b == "MergedWithPrevious") return B::merged_with_previous;
  if (b == "MergedWithNext") return B::merged_with_next;
  if (b == "Contiguous") return B::contiguous;
  r.fail(
      path,
      "\"" + sanitize_utf8(b, 60) +
          "\" is not a split behaviour (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

std::shared_ptr<const Regex> compile(const Reader& r, const std::string& pattern, const std::string& path) {
  try {
    return std::make_shared<const Regex>(pattern);
  } catch (const Error& e) {
    r.fail(path, e.what());
  }
}

void read_pre_tokenizer(const Reader& r, const json& v, const std::string& path,
                        std::vector<PreTokenizer>& out, int depth) {
  const std::string type = type_of(r, v, path);
  if (type == "Sequence") {
    r.only(v, path, {"type", "pretokenizers"});
    if (depth > 8) r.fail(path, "nests Sequences deeper than 8");
    if (!v.contains("pretokenizers")) r.fail(path, "has no \"pretokenizers\"");
    const json& list = r.array(v["pretokenizers"], path + ".pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(r, list[i], path + ".pretokenizers[" + std::to_string(i) + "]", out, depth + 1);
    return;
  }
  if (!out.empty() && out.back().kind == PreTokenizer::Kind::byte_level)
    r.fail(path,
           "a " + type + " after ByteLevel is not supported (it would see the byte alphabet's characters)");
  PreTokenizer p;
  if (type == "Split") {
    r.only(v, path, {"type", "pattern", "behavior", "invert"});
    if (!v.contains("pattern")) r.fail(path, "has no \"pattern\"");
    const json& pat = r.object(v["pattern"], path + ".pattern");
    if (pat.size() != 1) r.fail(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    if (pat.contains("Regex")) {
      p.kind = PreTokenizer::Kind::split_regex;
      p.regex = compile(r, r.string(pat["Regex"], path + ".pattern.Regex"), path + ".pattern.Regex");
    } else if (pat.contains("String")) {
      p.kind = PreTokenizer::Kind::split_string;
      p.literal = r.string(pat["String"], path + ".pattern.String");
      if (p.literal.empty() || !valid_utf8(p.literal))
        r.fail(path + ".pattern.String", "must be non-empty UTF-8");
    } else {
      r.fail(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!v.contains("behavior")) r.fail(path, "has no \"behavior\"");
    p.behavior = behavior_of(r, v["behavior"], path + ".behavior");
    p.invert = v.contains("invert") && r.boolean(v["invert"], path + ".invert");
  } else if (type == "ByteLevel") {
    r.only(v, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    p.kind = PreTokenizer::Kind::byte_level;
    p.add_prefix_space =
        v.contains("add_prefix_space") && r.boolean(v["add_prefix_space"], path + ".add_prefix_space");
    const bool use_regex = !v.contains("use_regex") || r.boolean(v["use_regex"], path + ".use_regex");
    if (use_regex) p.regex = compile(r, kGpt2Pattern, path);
    p.behavior = PreTokenizer::Behavior::isolated;
  } else {
    r.fail(path + ".type",
           "\"" + sanitize_utf8(type, 60) +
               "\" is not supported (troupe reads Split, ByteLevel and Sequence pre-tokenizers)");
  }
  out.push_back(std::move(p));
}

void read_model(const Reader& r, const json& m, Tokenizer::Impl& t, std::vector<std::string>& model_text) {
  const std::string type = type_of(r, m, "model");
  if (type != "BPE")
    r.fail("model.type",
           "\"" + sanitize_utf8(type, 60) + "\" is not supported (troupe reads byte-level BPE models)");
  r.only(m, "model",
         {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
          "byte_fallback", "ignore_merges", "vocab", "merges"});
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"] == 0))
    r.fail("model.dropout", "is " + brief(m["dropout"]) + ": BPE dropout makes encoding random");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      r.fail(std::string("model.") + k,
             "is " + brief(m[k]) + ": only byte-level BPE without one is supported");
  r.flag(m, "model", "byte_fallback", false, false,
         "byte fallback is not supported (a byte-level BPE needs none)");
  if (m.contains("unk_token") && !m["unk_token"].is_null()) r.string(m["unk_token"], "model.unk_token");
  if (m.contains("fuse_unk") && !m["fuse_unk"].is_null()) r.boolean(m["fuse_unk"], "model.fuse_unk");
  t.ignore_merges = m.contains("ignore_merges") && !m["ignore_merges"].is_null() &&
                    r.boolean(m["ignore_merges"], "model.ignore_merges");

  if (!m.contains("vocab")) r.fail("model", "has no \"vocab\"");
  const json& vocab = r.object(m["vocab"], "model.vocab");
  t.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string path = "model.vocab[" + brief(it.key()) + "]";
    const uint32_t id = r.id(it.value(), path);
    // Ids may leave gaps (GPT-4o's do), but not so many that tables by id outgrow the file.
    if (id > vocab.size() + kMaxIdGap)
      r.fail(path, "id " + std::to_string(id) + " is far beyond the " + std::to_string(vocab.size()) +
                       " tokens of model.vocab (ids leave gaps of at most " + std::to_string(kMaxIdGap) +
                       ")");
    if (id >= model_text.size()) model_text.resize(size_t(id) + 1);
    if (t.present.size() <= id) t.present.resize(size_t(id) + 1, 0);
    if (t.present[id])
      r.fail(path, "id " + std::to_string(id) + " is also given to " + brief(model_text[id]));
    t.present[id] = 1;
    model_text[id] = it.key();
    t.vocab.emplace(it.key(), id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    const uint32_t c = byte_char(uint8_t(b));
    ch += char(0xC0 | (c >> 6));
    ch += char(0x80 | (c & 0x3F));
    if (c < 0x80) ch = std::string(1, char(c));
    auto it = t.vocab.find(ch);
    if (it == t.vocab.end())
      r.fail("model.vocab", "has no token for the byte-level character \"" + ch + "\" (byte " +
                                std::to_string(b) + "): not a byte-level BPE, or a damaged file");
    t.byte_id[size_t(b)] = it->second;
  }

  if (!m.contains("merges")) r.fail("model", "has no \"merges\"");
  const json& merges = r.array(m["merges"], "model.merges");
  t.merges.reserve(merges.size());
  if (t.ignore_merges) {  // a piece is looked up by its bytes: each token's characters mapped back
    for (const auto& [text, id] : t.vocab) {
      std::string raw;
      bool mapped = true;
      for (size_t i = 0; i < text.size() && mapped;) {
        const auto c0 = static_cast<unsigned char>(text[i]);
        const uint32_t c =
            c0 < 0x80 ? c0 : (c0 & 0x1Fu) << 6 | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
        const int b = c0 < 0x80 || (c0 >= 0xC0 && c0 < 0xE0) ? char_byte(c) : -1;
        mapped = b >= 0;
        raw += char(b);
        i += c0 < 0x80 ? 1 : 2;
      }
      if (mapped) t.vocab_bytes.put(raw, {id, 0});
    }
  }
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos)
        r.fail(path, "is " + brief(e) + ", not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      r.fail(path, "is " + brief(e) + ", neither \"a b\" nor [\"a\", \"b\"]");
    }
    joined = a + b;
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), ij = t.vocab.find(joined);
    if (ia == t.vocab.end()) r.fail(path, "uses " + brief(a) + ", which is not in model.vocab");
    if (ib == t.vocab.end()) r.fail(path, "uses " + brief(b) + ", which is not in model.vocab");
    if (ij == t.vocab.end()) r.fail(path, "makes " + brief(joined) + ", which is not in model.vocab");
    // A repeated pair takes its later rank, as the library's map of merges keeps the last one.
    t.merges.put(ia->second, ib->second, {uint32_t(i), ij->second});
  }
}

// The library's id for an added token: the model's when the model has its text, else one past
// the largest added id (at least the model's vocabulary size).
void read_added(const Reader& r, const json& list, Tokenizer::Impl& t, std::vector<std::string>& text) {
  const uint32_t model_size = uint32_t(t.vocab.size());
  std::optional<uint32_t> max_added;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const json& a = r.object(list[i], path);
    r.only(a, path, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    if (!a.contains("id") || !a.contains("content")) r.fail(path, "needs \"id\" and \"content\"");
    AddedToken tok;
    tok.id = r.id(a["id"], path + ".id");
    if (tok.id > t.vocab.size() + list.size() + kMaxIdGap)
      r.fail(path + ".id", "id " + std::to_string(tok.id) + " is far beyond the tokens of the file");
    tok.content = r.string(a["content"], path + ".content");
    if (tok.content.empty() || !valid_utf8(tok.content)) r.fail(path + ".content", "must be non-empty UTF-8");
    r.flag(a, path, "single_word", false, false, "an added token matched as a single word is not supported");
    r.flag(a, path, "lstrip", false, false, "an added token that strips spaces on its left is not supported");
    r.flag(a, path, "rstrip", false, false,
           "an added token that strips spaces on its right is not supported");
    tok.special =
        a.contains("special") && !a["special"].is_null() && r.boolean(a["special"], path + ".special");
    tok.normalized = a.contains("normalized") && !a["normalized"].is_null() &&
                     r.boolean(a["normalized"], path + ".normalized");
    if (t.added_ids.count(tok.content)) r.fail(path, "repeats the added token " + brief(tok.content));
    auto in_model = t.vocab.find(tok.content);
    const uint32_t want = in_model != t.vocab.end()  ? in_model->second
                          : !max_added               ? model_size
                          : *max_added >= model_size ? *max_added + 1
                                                     : model_size;
    if (tok.id != want)
      r.fail(path + ".id", "is " + std::to_string(tok.id) + ", but the tokenizers library gives " +
                               brief(tok.content) + " id " + std::to_string(want) +
                               " (its text's id in model.vocab, else the next free id)");
    max_added = std::max(max_added.value_or(0), tok.id);
    if (in_model == t.vocab.end()) {
      if (t.present.size() <= tok.id) t.present.resize(size_t(tok.id) + 1, 0);
      if (t.present[tok.id]) r.fail(path + ".id", "id " + std::to_string(tok.id) + " is taken");
      t.present[tok.id] = 1;
      if (text.size() <= tok.id) text.resize(size_t(tok.id) + 1);
      text[tok.id] = tok.content;
    }
    t.added_ids.emplace(tok.content, tok.id);
    t.added.push_back(std::move(tok));
  }
}

void build_matchers(Tokenizer::Impl& t) {
  for (uint32_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    const int pass = a.normalized ? 1 : 0;
    const auto first = static_cast<unsigned char>(a.content[0]);
    t.all[pass].by_first[first].push_back(i);
    t.all[pass].empty = false;
    if (!a.special) {
      t.plain[pass].by_first[first].push_back(i);
      t.plain[pass].empty = false;
    }
  }
  for (auto* set : {&t.plain[0], &t.plain[1], &t.all[0], &t.all[1]})
    for (auto& v : set->by_first)
      std::stable_sort(v.begin(), v.end(), [&](uint32_t x, uint32_t y) {
        return t.added[x].content.size() > t.added[y].content.size();
      });
}

// bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}; null: none.
std::optional<uint32_t> config_token(const Reader& r, const json& cfg, const char* key,
                                     const Tokenizer::Impl& t) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  std::string text;
  if (it->is_object() && it->contains("content"))
    text = r.string((*it)["content"], std::string(key) + ".content");
  else
    text = r.string(*it, key);
  auto a = t.added_ids.find(text);
  if (a != t.added_ids.end()) return a->second;
  auto v = t.vocab.find(text);
  if (v != t.vocab.end()) return v->second;
  r.fail(key, brief(text) + " is not a token of the tokenizer");
}

}  // namespace

Tokenizer Tokenizer::parse(std::string_view text, std::string_view config_text, const std::string& where) {
  auto t = std::make_unique<Impl>();
  const Reader r(where);
  if (json_depth(text, kMaxDepth) > kMaxDepth) r.fail("(root)", "nests deeper than a tokenizer does");
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(where + ": not JSON");
  r.object(j, "(root)");
  r.only(j, "",
         {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
          "decoder", "model"});
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    r.fail("normalizer", "type " + brief(j["normalizer"].value("type", json("?"))) +
                             " is not supported (troupe reads tokenizers without a normalizer)");
  if (!j.contains("model")) r.fail("(root)", "has no \"model\": not a tokenizer.json");
  std::vector<std::string> text_of;  // id -> the token's text in the file
  read_model(r, j["model"], *t, text_of);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null())
    read_added(r, r.array(j["added_tokens"], "added_tokens"), *t, text_of);
  build_matchers(*t);

  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    r.fail("pre_tokenizer", "is null: a byte-level BPE needs the ByteLevel pre-tokenizer");
  read_pre_tokenizer(r, j["pre_tokenizer"], "pre_tokenizer", t->pre, 0);
  if (t->pre.size() > kMaxSteps)
    r.fail("pre_tokenizer", "has " + std::to_string(t->pre.size()) + " steps, more than the " +
                                std::to_string(kMaxSteps) + " a tokenizer needs");
  if (t->pre.empty() || t->pre.back().kind != PreTokenizer::Kind::byte_level)
    r.fail("pre_tokenizer", "has no ByteLevel step: not a byte-level BPE");
  if (!j.contains("decoder") || j["decoder"].is_null())
    r.fail("decoder", "is null: a byte-level BPE needs ByteLevel");
  const std::string dec = type_of(r, j["decoder"], "decoder");
  if (dec != "ByteLevel")
    r.fail("decoder.type",
           "\"" + sanitize_utf8(dec, 60) + "\" is not supported (troupe decodes with ByteLevel)");
  r.only(j["decoder"], "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"});

  // Decoded bytes of every id.
  const size_t n = t->present.size();
  t->special.assign(n, 0);
  for (const AddedToken& a : t->added) t->special[a.id] = a.special;
  t->offsets.assign(n + 1, 0);
  for (size_t id = 0; id < n; ++id) {
    t->offsets[id] = t->bytes.size();
    if (!t->present[id]) continue;
    const std::string& s = text_of[id];
    std::string out;
    bool mapped = true;
    for (size_t i = 0; i < s.size() && mapped;) {
      const auto c0 = static_cast<unsigned char>(s[i]);
      uint32_t c = c0;
      size_t len = 1;
      if (c0 >= 0xC0 && c0 < 0xE0 && i + 1 < s.size())
        c = (c0 & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu), len = 2;
      else if (c0 >= 0x80)
        len = 0;
      const int b = len ? char_byte(c) : -1;
      if (b < 0)
        mapped = false;
      else
        out += char(b);
      i += len;
    }
    t->bytes += mapped ? out : s;  // the library's decoder: a token not of the alphabet gives its UTF-8
  }
  t->offsets[n] = t->bytes.size();

  if (!config_text.empty()) {
    const Reader cr(where.substr(0, where.rfind('/') + 1) + "tokenizer_config.json");
    if (json_depth(config_text, kMaxDepth) > kMaxDepth) cr.fail("(root)", "nests too deep");
    const json c = json::parse(config_text, nullptr, false);
    if (c.is_discarded() || !c.is_object()) cr.fail("(root)", "not a JSON object");
    t->bos = config_token(cr, c, "bos_token", *t);
    t->eos = config_token(cr, c, "eos_token", *t);
    if (c.contains("add_bos_token") && !c["add_bos_token"].is_null())
      t->add_bos = cr.boolean(c["add_bos_token"], "add_bos_token");
  }
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::load(const std::string& path) {
  const std::string text = read_regular_file(path, kMaxFileBytes, "tokenizer");
  const std::string cfg = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  std::string config;
  if (std::filesystem::exists(cfg, ec)) config = read_regular_file(cfg, kMaxConfigBytes, "tokenizer config");
  return parse(text, config, "tokenizer " + path);
}

bool looks_like_hf_tokenizer(std::string_view text) {
  // A scan of the top-level keys, without parsing the (large) file twice.
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = ++i;
      while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (i >= text.size()) return false;
      if (depth != 1) continue;
      size_t j = i + 1;
      while (j < text.size() && (text[j] == ' ' || text[j] == '\n' || text[j] == '\r' || text[j] == '\t'))
        ++j;
      if (j < text.size() && text[j] == ':' && text.substr(start, i - start) == "model") return true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace troupe::hf
