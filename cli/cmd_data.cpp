// `troupe data tokenize|encode|decode`: turn text corpora into token files with troupe's
// own byte-level BPE (core/bpe.hpp) or a Hugging Face tokenizer.json (core/hf_tokenizer.hpp),
// and token files back into text.
//
//   troupe data tokenize CORPUS... --vocab N --out DIR [--val-fraction F]
//   troupe data tokenize CORPUS... --tokenizer FILE --out DIR [--val-fraction F] [--special]
//       -> DIR/tokenizer.json (+ tokenizer_config.json), DIR/train.bin, DIR/val.bin
//   troupe data encode --tokenizer FILE IN... --out FILE.bin [--special]
//   troupe data decode --tokenizer FILE IN.bin [--max-tokens K] [--dtype uint16|uint32]
//
// A corpus path is a file or a directory read as Dataset::from_path reads one
// (core/corpus_files.hpp); each non-empty file is a document, framed as the tokenizer's models
// expect (core/tokenizer.hpp: troupe's BPE puts end-of-text between documents, a Hugging Face
// tokenizer bos before and eos after each). Token files are llm.c's format
// (core/token_writer.hpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.hpp"
#include "core/bpe.hpp"
#include "core/corpus_files.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/token_file.hpp"
#include "core/token_writer.hpp"
#include "core/tokenizer.hpp"

namespace troupe::cli {

namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

// A failure the user fixes (a missing corpus, a bad tokenizer or token file): exit 2.
// Anything else that throws (a full disk) exits 1.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

std::string mb_per_s(size_t bytes, double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds > 0 ? double(bytes) / 1e6 / seconds : 0.0);
  return buf;
}

struct Corpus {
  std::vector<std::string> docs;
  size_t bytes = 0;
};

Corpus read_corpus(const std::vector<std::string>& paths) {
  Corpus c;
  for (const auto& p : paths) {
    if (!fs::exists(p)) throw UsageError("corpus path " + p + " does not exist");
    try {
      for_each_text_file(p, [&](const std::string&, std::string_view text) {
        if (text.empty()) return;  // no document: it would only add an end-of-text token
        c.docs.emplace_back(text);
        c.bytes += text.size();
      });
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  if (c.docs.empty()) throw UsageError("the corpus holds no text (files with NUL bytes are skipped)");
  return c;
}

std::unique_ptr<TextTokenizer> read_tokenizer(const std::string& path) {
  try {
    return load_tokenizer(path);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

// The corpus's ids, framed; reports documents that are not UTF-8 (a Hugging Face tokenizer
// reads them with U+FFFD for each ill-formed sequence, as Python's errors="replace" does).
std::vector<uint32_t> encode_corpus(const TextTokenizer& tok, const Corpus& c, bool special,
                                    std::vector<size_t>* starts) {
  if (special && !tok.has_special_tokens())
    throw UsageError("--special: troupe's own BPE has no special tokens to read from text");
  if (tok.has_special_tokens()) {
    size_t bad = 0;
    for (const auto& d : c.docs) bad += valid_utf8(d) ? 0 : 1;
    if (bad)
      std::cerr << "  " << bad
                << " document(s) hold bytes that are not UTF-8: each ill-formed sequence is read "
                << "as U+FFFD (as Python's decode(errors=\"replace\"))\n";
  }
  return encode_documents(tok, c.docs, special, starts);
}

// Where train ends and val begins in a stream of n tokens: the document start nearest
// to (1 - F) * n (the earlier on a tie), so no document is cut; when there is only one
// document, the token nearest that point. F = 0: everything is train.
//
//   starts {0, 40, 90}, n = 100, F = 0.05: target 95 -> 90 (val = the last document)
size_t split_point(const std::vector<size_t>& starts, size_t n, double val_fraction) {
  if (val_fraction <= 0 || n == 0) return n;
  const double target = (1.0 - val_fraction) * double(n);
  if (starts.size() < 2) {
    const size_t p = size_t(target + 0.5);
    return std::min(std::max<size_t>(p, 1), n);
  }
  size_t best = starts[1];
  for (size_t i = 2; i < starts.size(); ++i)
    if (std::abs(double(starts[i]) - target) < std::abs(double(best) - target)) best = starts[i];
  return best;
}

// ---------------------------------------------------------------- tokenize

struct TokenizeOptions {
  std::vector<std::string> corpus;
  int64_t vocab = 0;
  std::string out;
  double val_fraction = 0.05;
  std::string tokenizer;
  bool special = false;
};

int tokenize(const TokenizeOptions& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw UsageError("--val-fraction must be in [0, 1), got " + std::to_string(o.val_fraction));
  if (o.tokenizer.empty() && o.vocab == 0) throw UsageError("--vocab N is required (or --tokenizer FILE)");
  std::unique_ptr<TextTokenizer> given = o.tokenizer.empty() ? nullptr : read_tokenizer(o.tokenizer);
  const Corpus c = read_corpus(o.corpus);
  std::cerr << "troupe data tokenize: " << c.docs.size() << " documents, " << c.bytes << " bytes\n";

  std::unique_ptr<TextTokenizer> trained;
  double train_s = 0;
  if (o.tokenizer.empty()) {
    const std::vector<std::string_view> views(c.docs.begin(), c.docs.end());
    auto last = clk::now();
    const auto t0 = clk::now();
    bpe::Tokenizer t = bpe::Tokenizer::train(views, o.vocab, [&](int64_t done, int64_t wanted) {
      if (seconds_since(last) < 1.0 && done < wanted) return;
      last = clk::now();
      std::cerr << "  training: " << done << "/" << wanted << " merges\n";
    });
    train_s = seconds_since(t0);
    if (t.vocab_size() < o.vocab)
      std::cerr << "  the corpus ran out of pairs: the vocabulary has " << t.vocab_size() << " tokens, not "
                << o.vocab << "\n";
    trained = from_bpe(std::move(t));
  }
  const TextTokenizer& tok = o.tokenizer.empty() ? *trained : *given;

  const auto t1 = clk::now();
  std::vector<size_t> starts;
  const std::vector<uint32_t> ids = encode_corpus(tok, c, o.special, &starts);
  const double encode_s = seconds_since(t1);
  const size_t split = split_point(starts, ids.size(), o.val_fraction);

  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) throw IoError("cannot create " + o.out + ": " + ec.message(), ec.value());
  const std::string tok_path = o.out + "/tokenizer.json";
  const std::string train_path = o.out + "/train.bin";
  const std::string val_path = o.out + "/val.bin";
  tok.save_into(o.out);
  write_token_file(train_path, ids.data(), split, uint64_t(tok.vocab_size()));
  std::string written = tok_path + " (" + std::to_string(tok.vocab_size()) + " tokens), " + train_path +
                        " (" + std::to_string(split) + " tokens)";
  if (o.val_fraction > 0 && split < ids.size()) {
    write_token_file(val_path, ids.data() + split, ids.size() - split, uint64_t(tok.vocab_size()));
    written += ", " + val_path + " (" + std::to_string(ids.size() - split) + " tokens)";
  } else {
    fs::remove(val_path, ec);  // a val.bin of an earlier run would pass for this one's
    if (o.val_fraction > 0)
      std::cerr << "  the corpus is too small for a validation split: no " << val_path << " written\n";
  }
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", ids.empty() ? 0.0 : double(c.bytes) / double(ids.size()));
  std::cout << "tokenized " << c.docs.size() << " documents, " << c.bytes << " bytes -> " << ids.size()
            << " tokens (" << ratio << " bytes/token), train "
            << (o.tokenizer.empty() ? mb_per_s(c.bytes, train_s) + " MB/s"
                                    : std::string("skipped (--tokenizer)"))
            << ", encode " << mb_per_s(c.bytes, encode_s) << " MB/s: wrote " << written << "\n";
  return kOk;
}

// ---------------------------------------------------------------- encode

struct EncodeOptions {
  std::string tokenizer;
  std::vector<std::string> in;
  std::string out;
  bool special = false;
};

int encode(const EncodeOptions& o) {
  const std::unique_ptr<TextTokenizer> tok = read_tokenizer(o.tokenizer);
  const Corpus c = read_corpus(o.in);
  const auto t0 = clk::now();
  const std::vector<uint32_t> ids = encode_corpus(*tok, c, o.special, nullptr);
  const double s = seconds_since(t0);
  write_token_file(o.out, ids.data(), ids.size(), uint64_t(tok->vocab_size()));
  std::cout << "encoded " << c.docs.size() << " documents, " << c.bytes << " bytes -> " << ids.size()
            << " tokens, " << mb_per_s(c.bytes, s) << " MB/s: wrote " << o.out << "\n";
  return kOk;
}

// ---------------------------------------------------------------- decode

struct DecodeOptions {
  std::string tokenizer;
  std::string in;
  int64_t max_tokens = -1;
  std::string dtype;  // for a headerless file; must agree with a header when given
};

int decode(const DecodeOptions& o) {
  const std::unique_ptr<TextTokenizer> tok = read_tokenizer(o.tokenizer);
  // The checks of data.source tokens (core/token_file.hpp): a header when the first int32
  // is the magic (its version must agree with --dtype when given), else raw --dtype ids.
  TokenFile file;
  try {
    file = TokenFile::open(o.in, o.dtype.empty() ? 0 : o.dtype == "uint32" ? 4 : 2);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  uint64_t count = file.size();
  if (o.max_tokens >= 0) count = std::min<uint64_t>(count, uint64_t(o.max_tokens));
  const auto* bytes = static_cast<const unsigned char*>(file.data());
  const size_t width = size_t(file.width());
  constexpr uint64_t kBlock = uint64_t(1) << 16;
  std::vector<uint32_t> ids;
  for (uint64_t done = 0; done < count;) {
    const size_t n = size_t(std::min(kBlock, count - done));
    ids.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const unsigned char* p = bytes + (done + i) * width;
      ids[i] = uint32_t(p[0]) | uint32_t(p[1]) << 8 |
               (width == 4 ? uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24 : 0);
      if (!tok->has_token(ids[i]))
        throw UsageError(o.in + ": token " + std::to_string(done + i) + " is " + std::to_string(ids[i]) +
                         (ids[i] >= tok->vocab_size()
                              ? ", outside the tokenizer's vocabulary of " + std::to_string(tok->vocab_size())
                              : ", an id the tokenizer has no token for"));
    }
    const std::string text = tok->decode(ids.data(), ids.size());
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
      throw IoError("cannot write to stdout", errno);
    done += n;
  }
  std::fflush(stdout);
  return kOk;
}

// Runs one subcommand: its failures become messages and exit codes.
template <class F>
int guarded(const char* name, F&& run) {
  try {
    return run();
  } catch (const UsageError& e) {
    std::cerr << "troupe data " << name << ": " << e.what() << "\n";
    return kUsage;
  } catch (const std::exception& e) {
    std::cerr << "troupe data " << name << ": " << e.what() << "\n";
    return kJobFailed;
  }
}

}  // namespace

void add_data_command(CLI::App& app, int* exit_code) {
  auto* data = app.add_subcommand("data", "Prepare training data: tokenize corpora, encode, decode");
  data->require_subcommand(1);

  static TokenizeOptions t;
  auto* tk = data->add_subcommand(
      "tokenize",
      "Train a byte-level BPE on text files (or take --tokenizer, troupe's or a Hugging Face tokenizer.json) "
      "and write DIR/tokenizer.json, DIR/train.bin and DIR/val.bin. Each file is a document; troupe's BPE "
      "joins documents with its end-of-text token, a Hugging Face tokenizer puts its bos before and eos "
      "after "
      "each (tokenizer_config.json). The validation split starts at the document boundary nearest to the "
      "last --val-fraction of the tokens (with a single document, at the nearest token)");
  tk->add_option("corpus", t.corpus, "Text files or directories (read recursively, sorted by path)")
      ->required();
  auto* vocab = tk->add_option("--vocab", t.vocab, "Vocabulary size: 256 bytes + end-of-text + merges")
                    ->check(CLI::Range(int64_t(257), troupe::bpe::kMaxVocab));
  tk->add_option("--out", t.out, "Output directory")->required();
  tk->add_option("--val-fraction", t.val_fraction, "Tail of the tokens for validation (0: no val.bin)")
      ->capture_default_str();
  tk->add_option("--tokenizer", t.tokenizer,
                 "Use this tokenizer instead of training one: troupe's JSON or a Hugging Face tokenizer.json")
      ->excludes(vocab);
  tk->add_flag(
      "--special", t.special,
      "Special tokens written in the text (\"<|eot_id|>\") become their ids (Hugging Face tokenizers; "
      "default: they are ordinary text)");
  tk->callback([exit_code] { *exit_code = guarded("tokenize", [] { return tokenize(t); }); });

  static EncodeOptions e;
  auto* en = data->add_subcommand(
      "encode", "Encode text files into one token file (documents framed as `tokenize` frames them)");
  en->add_option("--tokenizer", e.tokenizer, "Tokenizer: troupe's JSON or a Hugging Face tokenizer.json")
      ->required();
  en->add_flag("--special", e.special, "Special tokens written in the text become their ids");
  en->add_option("in", e.in, "Text files or directories")->required();
  en->add_option("--out", e.out, "Token file to write (.bin)")->required();
  en->callback([exit_code] { *exit_code = guarded("encode", [] { return encode(e); }); });

  static DecodeOptions d;
  auto* de = data->add_subcommand(
      "decode",
      "Decode a token file to text on stdout (troupe's end-of-text prints nothing, a Hugging "
      "Face special token its text)");
  de->add_option("--tokenizer", d.tokenizer, "Tokenizer: troupe's JSON or a Hugging Face tokenizer.json")
      ->required();
  de->add_option("in", d.in, "Token file (.bin, with an llm.c header or raw)")->required();
  de->add_option("--max-tokens", d.max_tokens, "Decode at most this many tokens")
      ->check(CLI::NonNegativeNumber);
  de->add_option("--dtype", d.dtype, "Width of a headerless file's tokens (default uint16)")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  de->callback([exit_code] { *exit_code = guarded("decode", [] { return decode(d); }); });
}

}  // namespace troupe::cli
