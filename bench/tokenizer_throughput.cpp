// Tokenizer figures on one core: BPE training MB/s, encoding and decoding MB/s (median of
// 5 after a warm-up) and bytes per token, at each vocabulary size, and the same for Hugging
// Face tokenizer.json files (their load time instead of training). Each row is checked:
// decode(encode(corpus)) must give the corpus back.
//
//   tokenizer_throughput [CORPUS (default /usr/share/games/fortunes)] [VOCAB... | TOKENIZER.json...]
//       (default 1024 4096)
//
// MB are 10^6 bytes of corpus text. Documents (files) are trained on and encoded one by
// one, as `troupe data tokenize` does: a Hugging Face tokenizer through one hf::Encoder, whose
// cache of pieces lives across documents (it starts cold in every timed run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "core/bpe.hpp"
#include "core/corpus_files.hpp"
#include "core/hf_tokenizer.hpp"

using namespace troupe;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clk::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string corpus = argc > 1 ? argv[1] : "/usr/share/games/fortunes";
  std::vector<int64_t> vocabs;
  std::vector<std::string> hf_files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() > 5 && a.substr(a.size() - 5) == ".json")
      hf_files.push_back(a);
    else
      vocabs.push_back(std::atoll(argv[i]));
  }
  if (vocabs.empty() && hf_files.empty()) vocabs = {1024, 4096};
  if (!std::filesystem::exists(corpus)) {
    std::fprintf(stderr, "tokenizer_throughput: %s does not exist (apt-get install fortunes)\n",
                 corpus.c_str());
    return 2;
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  for_each_text_file(corpus, [&](const std::string&, std::string_view text) {
    docs.emplace_back(text);
    bytes += text.size();
  });
  const std::vector<std::string_view> views(docs.begin(), docs.end());
  std::printf("corpus %s: %zu documents, %.2f MB\n", corpus.c_str(), docs.size(), bytes / 1e6);
  if (!vocabs.empty())
    std::printf("%6s %8s %10s %11s %11s %12s %6s\n", "vocab", "train s", "train MB/s", "encode MB/s",
                "decode MB/s", "bytes/token", "check");
  for (int64_t vocab : vocabs) {
    const auto t0 = clk::now();
    const bpe::Tokenizer tok = bpe::Tokenizer::train(views, vocab);
    const double train_s = seconds_since(t0);
    std::vector<std::vector<uint32_t>> ids(docs.size());
    const double enc_s = median_seconds(5, [&] {
      for (size_t d = 0; d < docs.size(); ++d) ids[d] = tok.encode(docs[d]);
    });
    size_t tokens = 0;
    for (const auto& v : ids) tokens += v.size();
    std::vector<std::string> back(docs.size());
    const double dec_s = median_seconds(5, [&] {
      for (size_t d = 0; d < docs.size(); ++d) back[d] = tok.decode(ids[d]);
    });
    const bool ok = back == docs;
    std::printf("%6d %8.2f %10.2f %11.2f %11.1f %12.3f %6s\n", tok.vocab_size(), train_s,
                bytes / 1e6 / train_s, bytes / 1e6 / enc_s, bytes / 1e6 / dec_s,
                double(bytes) / double(tokens), ok ? "ok" : "FAILED");
  }
  for (const std::string& file : hf_files) {
    const auto t0 = clk::now();
    const hf::Tokenizer tok = hf::Tokenizer::load(file);
    const double load_s = seconds_since(t0);
    std::vector<std::vector<uint32_t>> ids(docs.size());
    std::vector<double> cpu;  // CPU seconds of each timed run: on a shared machine, the core's own figure
    const double enc_s = median_seconds(5, [&] {
      const std::clock_t c0 = std::clock();
      hf::Encoder e(tok);
      for (size_t d = 0; d < docs.size(); ++d) {
        ids[d].clear();
        e.encode(docs[d], false, ids[d]);
      }
      cpu.push_back(double(std::clock() - c0) / CLOCKS_PER_SEC);
    });
    std::sort(cpu.begin() + 1, cpu.end());  // cpu[0] is the warm-up
    const double enc_cpu_s = cpu[1 + (cpu.size() - 1) / 2];
    size_t tokens = 0;
    for (const auto& v : ids) tokens += v.size();
    std::vector<std::string> back(docs.size());
    const double dec_s = median_seconds(5, [&] {
      for (size_t d = 0; d < docs.size(); ++d) back[d] = tok.decode(ids[d].data(), ids[d].size());
    });
    const bool ok = back == docs;
    std::printf(
        "%s (Hugging Face, %u ids): load %.2f s, encode %.2f MB/s (%.2f MB/s of CPU time), decode %.1f MB/s, "
        "%.3f "
        "bytes/token, %s\n",
        file.c_str(), tok.vocab_size(), load_s, bytes / 1e6 / enc_s, bytes / 1e6 / enc_cpu_s,
        bytes / 1e6 / dec_s, double(bytes) / double(tokens), ok ? "ok" : "FAILED");
  }
  return 0;
}
