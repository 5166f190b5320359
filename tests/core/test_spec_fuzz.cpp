// Mutation fuzzing of the hostile-input parsers. The spec parser: every shipped config, mutated thousands of
// times with a fixed seed, must either parse (and then round-trip through to_yaml) or throw SpecError with
// usable diagnostics. Any other exception, a crash or a sanitizer report fails the test.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/bpe.hpp"
#include "core/error.hpp"
#include "core/json_read.hpp"
#include "core/spec.hpp"
#include "core/trace.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(std::string text) {
    int n = 1 + pick(3);
    for (int i = 0; i < n; ++i) text = once(text);
    return text;
  }

 private:
  size_t pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  std::string once(const std::string& text) {
    auto lines = split_lines(text);
    if (lines.empty()) lines.push_back("");
    size_t i = pick(lines.size());
    switch (pick(9)) {
      case 0:  // delete a line
        lines.erase(lines.begin() + static_cast<long>(i));
        return join_lines(lines);
      case 1: {  // swap a value for one of another type
        static const char* kValues[] = {"[1, 2]",
                                        "{a: 1}",
                                        "\"str\"",
                                        "true",
                                        "-1",
                                        "1.5",
                                        "",
                                        "~",
                                        "auto",
                                        "1e999",
                                        "0x10",
                                        "99999999999999999999",
                                        "0",
                                        "yes",
                                        "&a 3",
                                        "*a",
                                        "!!binary AAAA",
                                        "|\n  block",
                                        "2 parsecs",
                                        "1s",
                                        "16GiB",
                                        "'\\x00'",
                                        "- 1",
                                        "nan",
                                        ".inf"};
        size_t colon = lines[i].find(':');
        if (colon == std::string::npos) return join_lines(lines);
        lines[i] = lines[i].substr(0, colon + 1) + " " + kValues[pick(std::size(kValues))];
        return join_lines(lines);
      }
      case 2:  // duplicate a line (a duplicate key) right after itself or elsewhere
        lines.insert(lines.begin() + static_cast<long>(pick(lines.size() + 1)), lines[i]);
        return join_lines(lines);
      case 3:  // truncate at a random byte
        return text.substr(0, pick(text.size() + 1));
      case 4: {  // insert random bytes
        std::string s = text;
        size_t at = pick(s.size() + 1);
        std::string junk;
        for (size_t k = 0, n = 1 + pick(8); k < n; ++k) junk += static_cast<char>(rng_() & 0xFF);
        return s.insert(at, junk);
      }
      case 5: {  // change a line's indentation
        int how = static_cast<int>(pick(4));
        if (how == 0) lines[i] = "  " + lines[i];
        if (how == 1 && lines[i].rfind("  ", 0) == 0) lines[i] = lines[i].substr(2);
        if (how == 2) lines[i] = "\t" + lines[i];
        if (how == 3) lines[i] = " " + lines[i];
        return join_lines(lines);
      }
      case 6: {  // overwrite a byte with a YAML-significant character
        static const char kSpecial[] = ":-[]{}&*!|>'\"%@`#,? \n\t";
        std::string s = text;
        if (!s.empty()) s[pick(s.size())] = kSpecial[pick(sizeof kSpecial - 1)];
        return s;
      }
      case 7: {  // swap two lines
        size_t j = pick(lines.size());
        std::swap(lines[i], lines[j]);
        return join_lines(lines);
      }
      default: {  // change a digit in a number, often to an extreme
        std::string s = text;
        std::vector<size_t> digits;
        for (size_t k = 0; k < s.size(); ++k)
          if (s[k] >= '0' && s[k] <= '9') digits.push_back(k);
        if (digits.empty()) return s;
        size_t at = digits[pick(digits.size())];
        static const char* kRepl[] = {"0", "1", "7", "00000000000", "9999999999", "-", ".", "e9"};
        return s.replace(at, 1, kRepl[pick(std::size(kRepl))]);
      }
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("spec fuzz: mutated configs parse or throw SpecError", "[core][spec][fuzz]") {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(TROUPE_SOURCE_DIR) / "configs"))
    if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 12);

  constexpr int kMutationsPerFile = 800;
  Mutator mutator(20240611);
  int parsed = 0, rejected = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int m = 0; m < kMutationsPerFile; ++m) {
      std::string text = mutator.mutate(original);
      try {
        troupe::JobSpec s = troupe::parse_spec(text, "fuzz.yaml");
        ++parsed;
        troupe::JobSpec back = troupe::parse_spec(troupe::to_yaml(s), "fuzz.yaml");
        if (!(back == s)) {
          INFO("config " << f.filename().string() << ", mutation " << m << ":\n" << text);
          FAIL("a parsed spec did not survive its to_yaml round trip");
        }
      } catch (const troupe::SpecError& e) {
        ++rejected;
        bool usable = !e.diagnostics.empty();
        for (const auto& d : e.diagnostics)
          usable = usable && !d.message.empty() && d.line >= 0 && d.col >= 0 && d.file == "fuzz.yaml";
        if (!usable) {
          INFO("config " << f.filename().string() << ", mutation " << m << ":\n" << text << "\n" << e.what());
          FAIL("SpecError without usable diagnostics");
        }
      } catch (const std::exception& e) {
        INFO("config " << f.filename().string() << ", mutation " << m << ":\n" << text);
        FAIL("parse_spec threw something other than SpecError: " << e.what());
      }
    }
  }
  // Both outcomes occur: the mutations reach past the syntax checks into validation.
  CHECK(parsed > 0);
  CHECK(rejected > 0);
  CHECK(parsed + rejected == static_cast<int>(files.size()) * kMutationsPerFile);
}

namespace {

// The inputs that attacked the JSON readers, as they were found.
std::vector<std::string> json_attacks() {
  std::string objects = "{\"traceEvents\": [";
  for (int i = 0; i < 200000; ++i) objects += i ? ",{}" : "{}";
  std::string keys = "{\"traceEvents\": [{\"ph\": \"X\", \"args\": {";
  for (int i = 0; i < 100000; ++i) keys += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  return {std::string(1000000, '['),
          std::string(100000, '[') + std::string(100000, ']'),
          std::string(5 << 20, '['),
          objects + "]}",
          keys + "}}]}",
          R"({"a": 1, "a": 2})",
          R"({"traceEvents": [], "traceEvents": []})",
          "[1e999, -1e999, 18446744073709551616]",
          "\"" + std::string(1 << 20, 'x') + "\"",
          "{\"\xff\": 1}",
          ""};
}

// Random damage to a text: bytes overwritten, cut, structural characters inserted.
std::string damage(std::mt19937_64& rng, std::string t) {
  for (int k = 1 + int(rng() % 4); k > 0; --k) {
    if (t.empty()) return t;
    const size_t at = rng() % t.size();
    switch (rng() % 4) {
      case 0:
        t[at] = static_cast<char>(rng());
        break;
      case 1:
        t = t.substr(0, at);
        break;
      case 2:
        t.insert(at, std::string(1 + rng() % 2000, "[{\",:}]1"[rng() % 8]));
        break;
      default:
        t.erase(at, 1 + rng() % 16);
    }
  }
  return t;
}

// read(path) either reads the file or throws troupe::Error; nothing else.
template <class Read>
void fuzz_file(const std::string& what, const std::string& path, const std::vector<std::string>& corpus,
               int n, Read&& read) {
  std::mt19937_64 rng(20261202);
  int ok = 0, refused = 0;
  auto once = [&](const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    try {
      read(path);
      ++ok;
    } catch (const troupe::Error&) {
      ++refused;
    } catch (const std::exception& e) {
      INFO(what << ": " << text.substr(0, 300));
      FAIL(what << ": something other than troupe::Error: " << e.what());
    }
  };
  for (const auto& a : json_attacks()) once(a);
  for (int i = 0; i < n; ++i) once(damage(rng, corpus[size_t(rng() % corpus.size())]));
  CHECK(refused > 0);
  CHECK(ok + refused == n + int(json_attacks().size()));
}

}  // namespace

TEST_CASE("json fuzz: traces, tokenizers and plain JSON, mutated and hostile, read or refused by name",
          "[core][fuzz][json]") {
  const fs::path dir = fs::temp_directory_path() / ("troupe_json_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // A real rank trace and a real tokenizer to mutate.
  const std::string trace_path = (dir / "rank0.json").string();
  troupe::trace::Span s;
  s.cat = "compute";
  s.name = "F0";
  s.ts_us = 10;
  s.dur_us = 5;
  s.step = 0;
  s.args = {{"op", "x"}};
  troupe::trace::write_rank_trace(trace_path, troupe::trace::RankInfo{0, 1, "1x1x1", "rank 0", 0, 0, 1},
                                  {s, s});
  std::ifstream tin(trace_path, std::ios::binary);
  const std::string trace((std::istreambuf_iterator<char>(tin)), std::istreambuf_iterator<char>());
  troupe::bpe::Tokenizer::train({"the cat sat on the mat, the cat ran"}, 270)
      .save((dir / "tok.json").string());
  std::ifstream kin(dir / "tok.json", std::ios::binary);
  const std::string tokenizer((std::istreambuf_iterator<char>(kin)), std::istreambuf_iterator<char>());

  const std::string path = (dir / "input.json").string();
  fuzz_file("trace", path, {trace}, 1500, [](const std::string& p) { troupe::trace::read_rank_trace(p); });
  fuzz_file("tokenizer", path, {tokenizer}, 1500,
            [](const std::string& p) { troupe::bpe::Tokenizer::load(p); });
  fuzz_file("json", path, {trace, tokenizer}, 1500, [](const std::string& p) {
    troupe::json_read::Limits l;
    l.max_depth = 16;
    troupe::json_read::read_file(p, "JSON file", l);
  });
  fs::remove_all(dir);
}
