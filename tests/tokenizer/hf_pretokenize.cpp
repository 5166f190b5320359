// hf_pretokenize CASES.json: for each case {"tokenizer": <tokenizer.json text>, "texts": [...]},
// the pieces troupe's pre-tokenizer cuts each text into (core/hf_tokenizer.hpp pre_tokenize), as
// JSON on stdout: [[pieces of text 0, ...], ...] per case, or "ERROR: ..." for a case it refuses.
// reference.js compares them with the tokenizers library's.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/hf_tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hf_pretokenize CASES.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::json cases = nlohmann::json::parse(in, nullptr, false);
  if (!cases.is_array()) {
    std::cerr << "hf_pretokenize: " << argv[1] << " is not a JSON array\n";
    return 2;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    try {
      const auto tok = troupe::hf::Tokenizer::parse(c.at("tokenizer").get<std::string>(), "", "case");
      nlohmann::json per = nlohmann::json::array();
      for (const auto& t : c.at("texts")) per.push_back(tok.pre_tokenize(t.get<std::string>()));
      out.push_back(per);
    } catch (const std::exception& e) {
      out.push_back(std::string("ERROR: ") + e.what());
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}
