// The byte-level BPE tokenizer against a naive reference (recount every pair each
// merge, apply merges in order), hand-checked merges, hostile tokenizer files, and
// the token-file writer.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/bpe.hpp"
#include "core/corpus_files.hpp"
#include "core/error.hpp"
#include "core/token_writer.hpp"

namespace fs = std::filesystem;
using troupe::bpe::Tokenizer;
using Ids = std::vector<uint32_t>;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("troupe_bpe_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// English-like text from a small vocabulary of words, punctuation, digits and UTF-8.
std::string words_corpus(uint32_t seed, size_t n_words) {
  static const char* kWords[] = {"the", "cat", "sat",  "on",       "mat",   "and",   "a",    "dog",
                                 "ran", "far", "away", "héllo",    "naïve", "42",    "1999", ",",
                                 ".",   "!\n", "\n\n", "  indent", "\t",    "don't", "Über"};
  std::mt19937 rng(seed);
  std::string s;
  for (size_t i = 0; i < n_words; ++i) {
    const char* w = kWords[rng() % (sizeof kWords / sizeof *kWords)];
    if (i && w[0] != ',' && w[0] != '.' && rng() % 4) s += ' ';
    s += w;
  }
  return s;
}

std::vector<std::string_view> views(const std::vector<std::string>& docs) {
  return std::vector<std::string_view>(docs.begin(), docs.end());
}

// The naive trainer the fast one must equal: recount all pairs over the distinct chunks
// each step, take the largest count (the smallest pair on ties), merge it everywhere.
std::vector<Tokenizer::Pair> reference_train(const std::vector<std::string>& docs, int vocab) {
  std::map<std::string, int64_t> chunks;
  for (const auto& d : docs)
    for (auto c : troupe::bpe::pretokenize(d)) ++chunks[std::string(c)];
  std::vector<std::pair<Ids, int64_t>> words;
  for (const auto& [c, n] : chunks) words.push_back({Ids(c.begin(), c.end()), n});
  for (auto& w : words)
    for (auto& s : w.first) s &= 0xff;
  std::vector<Tokenizer::Pair> merges;
  while (int(257 + merges.size()) < vocab) {
    std::map<std::pair<uint32_t, uint32_t>, int64_t> counts;
    for (const auto& [s, n] : words)
      for (size_t i = 0; i + 1 < s.size(); ++i) counts[{s[i], s[i + 1]}] += n;
    if (counts.empty()) break;
    auto best = counts.begin();  // std::map order: the smallest pair wins ties
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;
    const uint32_t z = uint32_t(257 + merges.size());
    merges.push_back({best->first.first, best->first.second});
    for (auto& w : words) {
      Ids out;
      for (size_t i = 0; i < w.first.size();) {
        if (i + 1 < w.first.size() && w.first[i] == best->first.first &&
            w.first[i + 1] == best->first.second) {
          out.push_back(z);
          i += 2;
        } else {
          out.push_back(w.first[i++]);
        }
      }
      w.first = out;
    }
  }
  return merges;
}

// The naive encoder: each chunk's bytes, then every merge in order, left to right.
Ids reference_encode(const Tokenizer& tok, std::string_view text) {
  Ids all;
  for (auto chunk : troupe::bpe::pretokenize(text)) {
    Ids s;
    for (char c : chunk) s.push_back(static_cast<uint8_t>(c));
    for (size_t m = 0; m < tok.merges().size(); ++m) {
      const auto p = tok.merges()[m];
      Ids out;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == p.a && s[i + 1] == p.b) {
          out.push_back(uint32_t(257 + m));
          i += 2;
        } else {
          out.push_back(s[i++]);
        }
      }
      s = out;
    }
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

std::string load_error(const std::string& path) {
  try {
    Tokenizer::load(path);
  } catch (const troupe::Error& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST_CASE("bpe: the pre-tokenizer cuts words, digits, punctuation and whitespace runs", "[bpe]") {
  using V = std::vector<std::string_view>;
  CHECK(troupe::bpe::pretokenize("Hello,  world 42!\n") ==
        V{"Hello", ",", " ", " world", " ", "42", "!", "\n"});
  CHECK(troupe::bpe::pretokenize("a  b") == V{"a", " ", " b"});
  CHECK(troupe::bpe::pretokenize(" ...x") == V{" ...", "x"});
  CHECK(troupe::bpe::pretokenize("\n\n the") == V{"\n\n", " the"});
  CHECK(troupe::bpe::pretokenize("héllo wörld") == V{"héllo", " wörld"});  // >= 0x80 is a letter
  CHECK(troupe::bpe::pretokenize("ab12 3") == V{"ab", "12", " ", "3"});    // digits take no space
  CHECK(troupe::bpe::pretokenize("   ") == V{"   "});
  CHECK(troupe::bpe::pretokenize("").empty());
  // Whatever the bytes, the chunks spell them back.
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    const std::string s = random_bytes(rng, rng() % 300);
    std::string back;
    for (auto c : troupe::bpe::pretokenize(s)) {
      REQUIRE_FALSE(c.empty());
      back += c;
    }
    REQUIRE(back == s);
  }
}

TEST_CASE("bpe: hand-checked merges of aaab, and a vocabulary smaller than asked when pairs run out",
          "[bpe]") {
  // "aaab": (a,a) twice, (a,b) once -> 257 = aa; "aa a b": (257,a) and (a,b) once each,
  // the smaller pair (97,98) wins -> 258 = ab; then 259 = aa+ab; then no pair is left.
  const Tokenizer tok = Tokenizer::train({"aaab"}, 1000);
  REQUIRE(tok.vocab_size() == 260);
  REQUIRE(tok.merges().size() == 3);
  CHECK((tok.merges()[0].a == 97 && tok.merges()[0].b == 97));
  CHECK((tok.merges()[1].a == 97 && tok.merges()[1].b == 98));
  CHECK((tok.merges()[2].a == 257 && tok.merges()[2].b == 258));
  CHECK(tok.encode("aaab") == Ids{259});
  CHECK(tok.encode("aab") == Ids{257, 98});
  CHECK(tok.encode("aaaa") == Ids{257, 257});
  CHECK(tok.token_bytes(259) == "aaab");
  CHECK(tok.token_bytes(256).empty());
  // Exactly the size asked when the corpus has pairs enough.
  CHECK(Tokenizer::train({"aaab"}, 258).vocab_size() == 258);
  CHECK(Tokenizer::train({"aaab"}, 257).vocab_size() == 257);
  // Merges never cross a chunk or a document: "a b" has only the pair (' ', 'b').
  const Tokenizer ab = Tokenizer::train({"a b", "c", ""}, 300);
  REQUIRE(ab.merges().size() == 1);
  CHECK((ab.merges()[0].a == ' ' && ab.merges()[0].b == 'b'));
  CHECK_THROWS_WITH(Tokenizer::train({"x"}, 256), Catch::Contains("outside [257, 2^24]"));
  CHECK_THROWS_WITH(Tokenizer::train({"x"}, (int64_t(1) << 24) + 1), Catch::Contains("outside [257, 2^24]"));
}

TEST_CASE("bpe: training equals the naive reference, and encoding equals merges applied in order", "[bpe]") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<std::string> docs;
    for (uint32_t d = 0; d < 4; ++d) docs.push_back(words_corpus(seed * 10 + d, 300));
    std::mt19937 rng(seed);
    docs.push_back(random_bytes(rng, 400));  // odd bytes train too
    const Tokenizer tok = Tokenizer::train(views(docs), 420);
    const auto ref = reference_train(docs, 420);
    REQUIRE(tok.merges().size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("seed " << seed << " merge " << i);
      REQUIRE(tok.merges()[i].a == ref[i].a);
      REQUIRE(tok.merges()[i].b == ref[i].b);
    }
    for (const auto& text : {docs[0], words_corpus(seed + 100, 200), random_bytes(rng, 500),
                             std::string(1000, ' ') + "x" + std::string(777, 'a')}) {
      REQUIRE(tok.encode(text) == reference_encode(tok, text));
    }
  }
}

TEST_CASE("bpe: decode(encode(s)) == s for random bytes, invalid UTF-8 and NULs, and eot decodes to nothing",
          "[bpe]") {
  std::vector<std::string> docs{words_corpus(5, 2000), std::string("\xff\xfe\0\0\x80 abc", 9)};
  const Tokenizer tok = Tokenizer::train(views(docs), 600);
  const Tokenizer bytes_only;
  std::mt19937 rng(11);
  std::vector<std::string> cases{"",
                                 std::string(1, '\0'),
                                 std::string("\0\0\0a\0", 5),
                                 "\xc3\x28 \xa0\xa1",
                                 "\xed\xa0\x80 surrogate",
                                 "\xf4\x90\x80\x80",
                                 words_corpus(99, 500)};
  for (int i = 0; i < 30; ++i) cases.push_back(random_bytes(rng, rng() % 2000));
  for (const auto& s : cases) {
    REQUIRE(tok.decode(tok.encode(s)) == s);
    REQUIRE(bytes_only.decode(bytes_only.encode(s)) == s);
    REQUIRE(bytes_only.encode(s).size() == s.size());
  }
  Ids with_eot = tok.encode("one");
  with_eot.push_back(tok.eot());
  for (uint32_t id : tok.encode("two")) with_eot.push_back(id);
  CHECK(tok.decode(with_eot) == "onetwo");
  const Ids bad{97, uint32_t(tok.vocab_size())};
  const std::string v = std::to_string(tok.vocab_size());
  CHECK_THROWS_WITH(tok.decode(bad),
                    Catch::Contains("token id " + v + " at position 1 is outside the vocabulary of " + v));
}

TEST_CASE("bpe: training is deterministic and save/load gives the same tokenizer", "[bpe]") {
  std::vector<std::string> docs;
  for (uint32_t d = 0; d < 6; ++d) docs.push_back(words_corpus(d, 3000));
  const Tokenizer a = Tokenizer::train(views(docs), 800);
  const Tokenizer b = Tokenizer::train(views(docs), 800);
  REQUIRE(a.to_json() == b.to_json());
  const std::string dir = temp_dir("save");
  a.save(dir + "/tok.json");
  CHECK_FALSE(fs::exists(dir + "/tok.json.tmp"));
  CHECK(read(dir + "/tok.json") == a.to_json());
  const Tokenizer c = Tokenizer::load(dir + "/tok.json");
  CHECK(c.to_json() == a.to_json());
  CHECK(c.encode(docs[0]) == a.encode(docs[0]));
  // The empty tokenizer round-trips too.
  Tokenizer().save(dir + "/empty.json");
  CHECK(Tokenizer::load(dir + "/empty.json").vocab_size() == 257);
  fs::remove_all(dir);
}

TEST_CASE("bpe: load refuses each kind of bad tokenizer file, naming the file and the problem", "[bpe]") {
  const std::string dir = temp_dir("bad");
  const std::string head =
      R"({"type": "troupe-bpe", "version": 1, "eot": 256, "pretokenizer": "troupe-v1", )";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json {", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "nests deeper"},
      {R"({"type": "gpt2", "version": 1, "vocab_size": 257, "eot": 256, "pretokenizer": "troupe-v1", "merges": []})",
       "type is \"gpt2\", not \"troupe-bpe\""},
      {R"({"type": "troupe-bpe", "version": 2, "vocab_size": 257, "eot": 256, "pretokenizer": "troupe-v1", "merges": []})",
       "version 2 is not supported"},
      {R"({"type": "troupe-bpe", "version": 1, "vocab_size": 257, "eot": 256, "pretokenizer": "gpt2", "merges": []})",
       "pretokenizer \"gpt2\" is unknown"},
      {R"({"type": "troupe-bpe", "version": 1, "vocab_size": 257, "eot": 0, "pretokenizer": "troupe-v1", "merges": []})",
       "eot is 0, must be 256"},
      {R"({"type": "troupe-bpe", "version": 1, "eot": 256, "pretokenizer": "troupe-v1", "merges": []})",
       "\"vocab_size\" is missing"},
      {head + R"("vocab_size": 257, "merges": [], "extra": 1})", "unknown key \"extra\""},
      {head + R"("vocab_size": 258, "merges": {}})", "merges is not an array"},
      {head + R"("vocab_size": 258, "merges": [[97, 98, 99]]})", "merge 0 is not a pair of ids"},
      {head + R"("vocab_size": 258, "merges": [[97, -1]]})", "merge 0 is not a pair of ids"},
      {head + R"("vocab_size": 258, "merges": [[97, 1.5]]})", "merge 0 is not a pair of ids"},
      {head + R"("vocab_size": 258, "merges": [[97, 257]]})",
       "merge 0 uses id 257, which does not exist before it"},
      {head + R"("vocab_size": 259, "merges": [[97, 98], [258, 97]]})",
       "merge 1 uses id 258, which does not exist"},
      {head + R"("vocab_size": 258, "merges": [[256, 97]]})", "merge 0 uses the end-of-text id 256"},
      {head + R"("vocab_size": 260, "merges": [[97, 98], [99, 100], [97, 98]]})",
       "merge 2 repeats the pair [97, 98] of merge 0"},
      {head + R"("vocab_size": 300, "merges": [[97, 98]]})", "vocab_size is 300 but 257 + 1 merges make 258"},
      {head + R"("vocab_size": "258", "merges": [[97, 98]]})", "vocab_size is \"258\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write(dir + "/bad" + std::to_string(i) + ".json", cases[i].first);
    const std::string msg = load_error(path);
    INFO(cases[i].first);
    CHECK_THAT(msg, Catch::StartsWith("tokenizer " + path + ": ") && Catch::Contains(cases[i].second));
  }
  // Merges that double one token again and again would spell terabytes: refused.
  std::string doubling = head + R"("vocab_size": 317, "merges": [[97, 97])";
  for (int i = 1; i < 60; ++i)
    doubling += ", [" + std::to_string(256 + i) + ", " + std::to_string(256 + i) + "]";
  CHECK_THAT(load_error(write(dir + "/doubling.json", doubling + "]}")),
             Catch::Contains("MiB of bytes in all"));
  // A file over the bound is refused before it is read.
  {
    std::ofstream huge(dir + "/huge.json", std::ios::binary);
    huge << head;
    huge.seekp(std::streamoff(troupe::bpe::kMaxFileBytes) + 10);
    huge << "}";
  }
  CHECK_THAT(load_error(dir + "/huge.json"), Catch::Contains("more than the 64 MiB a tokenizer may be"));
  CHECK_THAT(load_error(dir + "/missing.json"),
             Catch::Contains("tokenizer " + dir + "/missing.json: cannot read it"));
  fs::remove_all(dir);
}

TEST_CASE("bpe: load of randomly damaged tokenizer files loads or throws troupe::Error, nothing else",
          "[bpe]") {
  const std::string dir = temp_dir("fuzz");
  const std::string good = Tokenizer::train({words_corpus(3, 500)}, 300).to_json();
  std::mt19937 rng(17);
  const char kBytes[] = "[]{},:\"0123456789-.e \\\xff";
  int loaded = 0;
  for (int i = 0; i < 400; ++i) {
    std::string text = good;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = kBytes[rng() % (sizeof kBytes - 1)];
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        default:
          text.insert(at, 1, kBytes[rng() % (sizeof kBytes - 1)]);
      }
      if (text.empty()) text = "x";
    }
    const std::string path = write(dir + "/t.json", text);
    try {
      const Tokenizer t = Tokenizer::load(path);
      REQUIRE(t.decode(t.encode("the cat")) == "the cat");
      ++loaded;
    } catch (const troupe::Error& e) {
      REQUIRE_THAT(e.what(), Catch::StartsWith("tokenizer " + path + ": "));
    }
  }
  CHECK(loaded < 400);
  fs::remove_all(dir);
}

TEST_CASE("bpe: fortunes at vocab 4096 compress to more than 2 bytes per token", "[bpe]") {
  const std::string corpus = "/usr/share/games/fortunes";
  REQUIRE(fs::exists(corpus));  // Debian's fortunes package (scripts/setup.sh installs it)
  std::vector<std::string> docs;
  size_t bytes = 0;
  troupe::for_each_text_file(corpus, [&](const std::string&, std::string_view t) {
    docs.emplace_back(t);
    bytes += t.size();
  });
  REQUIRE(bytes > 1000000);
  const Tokenizer tok = Tokenizer::train(views(docs), 4096);
  REQUIRE(tok.vocab_size() == 4096);
  size_t tokens = 0;
  for (const auto& d : docs) {
    const Ids ids = tok.encode(d);
    tokens += ids.size();
    REQUIRE(tok.decode(ids) == d);
  }
  INFO("bytes/token " << double(bytes) / double(tokens));
  CHECK(double(bytes) / double(tokens) > 2.0);
}

TEST_CASE("token files: llm.c header, little-endian ids, uint32 past 65536 ids, ids checked", "[bpe]") {
  const std::string dir = temp_dir("tokfile");
  const Ids ids{0, 1, 256, 65535};
  troupe::write_token_file(dir + "/a.bin", ids.data(), ids.size(), 65536);
  std::string a = read(dir + "/a.bin");
  REQUIRE(a.size() == 1024 + 4 * 2);
  int32_t h[256];
  std::memcpy(h, a.data(), sizeof h);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  CHECK(h[2] == 4);
  for (int i = 3; i < 256; ++i) REQUIRE(h[i] == 0);
  CHECK(a.substr(1024) == std::string("\0\0\1\0\0\1\xff\xff", 8));
  troupe::write_token_file(dir + "/b.bin", ids.data(), ids.size(), 65537);
  std::string b = read(dir + "/b.bin");
  REQUIRE(b.size() == 1024 + 4 * 4);
  std::memcpy(h, b.data(), sizeof h);
  CHECK(h[1] == 2);
  CHECK(b.substr(1024 + 8) == std::string("\0\1\0\0\xff\xff\0\0", 8));
  troupe::write_token_file(dir + "/empty.bin", nullptr, 0, 300);
  CHECK(fs::file_size(dir + "/empty.bin") == 1024);
  CHECK_THROWS_WITH(troupe::write_token_file(dir + "/c.bin", ids.data(), ids.size(), 300),
                    Catch::Contains("token 3 is 65535, outside the vocabulary of 300"));
  CHECK_FALSE(fs::exists(dir + "/c.bin"));
  CHECK_FALSE(fs::exists(dir + "/c.bin.tmp"));
  fs::remove_all(dir);
}

TEST_CASE("corpus files: sorted, recursive, without links or files holding NUL", "[bpe]") {
  const std::string dir = temp_dir("corpus");
  fs::create_directories(dir + "/b");
  write(dir + "/b/z.txt", "z");
  write(dir + "/a.txt", "a");
  write(dir + "/c.dat", std::string("x\0y", 3));
  fs::create_symlink(dir + "/a.txt", dir + "/a.u8");
  std::vector<std::string> seen;
  troupe::for_each_text_file(dir, [&](const std::string& f, std::string_view t) {
    seen.push_back(fs::path(f).filename().string() + "=" + std::string(t));
  });
  CHECK(seen == std::vector<std::string>{"a.txt=a", "z.txt=z"});
  seen.clear();
  troupe::for_each_text_file(dir + "/a.txt",
                             [&](const std::string&, std::string_view t) { seen.emplace_back(t); });
  CHECK(seen == std::vector<std::string>{"a"});
  fs::remove_all(dir);
}

TEST_CASE("bpe: text without spaces is cut into chunks of at most kMaxChunk bytes, and round-trips",
          "[bpe]") {
  std::string cjk;
  for (int i = 0; i < 2000; ++i) cjk += "\xe6\x97\xa5\xe6\x9c\xac";  // no ASCII at all: one letter run
  const auto chunks = troupe::bpe::pretokenize(cjk);
  REQUIRE(chunks.size() == (cjk.size() + troupe::bpe::kMaxChunk - 1) / troupe::bpe::kMaxChunk);
  std::string joined;
  for (auto c : chunks) {
    CHECK(c.size() <= troupe::bpe::kMaxChunk);
    joined += c;
  }
  CHECK(joined == cjk);
  const auto tok = Tokenizer::train({cjk}, 300);
  const auto ids = tok.encode(cjk);
  CHECK(tok.decode(ids.data(), ids.size()) == cjk);
  CHECK(ids.size() < cjk.size() / 2);  // it still learns the repeated characters
}
