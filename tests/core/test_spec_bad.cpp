// The malformed-spec corpus: each file in tests/data/bad_specs/ starts with
//   # expect: LINE:COL: message fragment
// naming where its primary error is and what the message says.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/spec.hpp"

namespace fs = std::filesystem;

namespace {

struct Expectation {
  int line = -1, col = -1;
  std::string fragment;
};

Expectation read_expectation(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string first;
  std::getline(in, first);
  // "# expect: 12:3: fragment"
  Expectation e;
  const std::string prefix = "# expect: ";
  if (first.rfind(prefix, 0) != 0) return e;
  std::istringstream rest(first.substr(prefix.size()));
  char colon1 = 0, colon2 = 0;
  if (!(rest >> e.line >> colon1 >> e.col >> colon2) || colon1 != ':' || colon2 != ':') return Expectation{};
  std::getline(rest >> std::ws, e.fragment);
  return e;
}

}  // namespace

TEST_CASE("every malformed spec in the corpus fails where and how it says", "[core][spec]") {
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "tests" / "data" / "bad_specs";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 30);

  for (const auto& file : files) {
    INFO("spec " << file.filename().string());
    Expectation want = read_expectation(file);
    REQUIRE(want.line >= 1);
    bool threw = false;
    try {
      troupe::load_spec(file.string());
    } catch (const troupe::SpecError& e) {
      threw = true;
      INFO("diagnostics:\n" << e.what());
      REQUIRE_FALSE(e.diagnostics.empty());
      bool found = false;
      for (const auto& d : e.diagnostics) {
        CHECK(d.file == file.string());
        CHECK_FALSE(d.message.empty());
        CHECK_FALSE(d.hint.empty());
        if (d.line == want.line && d.col == want.col && d.message.find(want.fragment) != std::string::npos)
          found = true;
      }
      CHECK(found);
      // Diagnostics come sorted by position, like a compiler's.
      CHECK(std::is_sorted(e.diagnostics.begin(), e.diagnostics.end(), [](const auto& a, const auto& b) {
        return a.line != b.line ? a.line < b.line : a.col < b.col;
      }));
    }
    CHECK(threw);
  }
}
