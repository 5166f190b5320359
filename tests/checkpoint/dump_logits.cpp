// dump_logits CKPT OUT TOKEN...: the logits (T, V) of the full model of a checkpoint for one
// sequence of T tokens, written to OUT as T*V little-endian f32 (row t: the logits after token
// t). The model is built and loaded as `troupe sample` does (cli/cmd_sample.cpp): the spec in the
// manifest, one Stage of every block, the f32 masters read whole. hf_reference.py compares them
// with a plain-torch forward of the Hugging Face export.
//
// dump_logits --hf HF_DIR SPEC OUT TOKEN...: the same for the model of SPEC read from a Hugging
// Face directory as model.init_from reads it (checkpoint/hf.hpp init_source): troupe's import.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf.hpp"
#include "core/spec.hpp"
#include "model/from_spec.hpp"
#include "model/stage.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  const bool hf = argc > 1 && std::strcmp(argv[1], "--hf") == 0;
  if (argc < (hf ? 6 : 4)) {
    std::fprintf(stderr,
                 "usage: dump_logits CKPT OUT TOKEN... | dump_logits --hf HF_DIR SPEC OUT TOKEN...\n");
    return 2;
  }
  try {
    JobSpec spec;
    std::optional<checkpoint::TensorSource> src;
    if (hf) {
      spec = load_spec(argv[3]);
    } else {
      const std::string dir = checkpoint::resolve(argv[1]);
      src.emplace(dir);
      spec = parse_spec(src->manifest()->spec_yaml, dir + "/manifest.json");
    }
    const model::ModelConfig cfg = model::model_config(spec);
    model::DeviceContext dc = model::DeviceContext::cpu();
    dc.compute_dtype = compute_dtype(spec.train.precision);
    model::Stage stage(cfg, LayerRange::full(cfg.n_layer), 1, 1, dc);
    if (hf) {
      const checkpoint::hf::SliceReader read = checkpoint::hf::init_source(argv[2], spec);
      for (auto& p : stage.params()) read(p.name, checkpoint::whole(p.data.shape()), p.data.f32());
    } else {
      for (auto& p : stage.params()) src->read(p.name, p.data.shape(), p.data.f32());
    }
    stage.store().refresh_compute();
    argv += hf ? 2 : 0;
    argc -= hf ? 2 : 0;

    std::vector<int32_t> tokens;
    for (int i = 3; i < argc; ++i) tokens.push_back(int32_t(std::strtol(argv[i], nullptr, 10)));
    const int T = int(tokens.size());
    if (T > cfg.seq_len) throw Error("more tokens than model.seq_len " + std::to_string(cfg.seq_len));
    for (int32_t t : tokens)
      if (t < 0 || t >= cfg.vocab_size)
        throw Error("token " + std::to_string(t) + " is not in the vocabulary");
    stage.forward(0, tokens.data(), nullptr, nullptr, 1, T);
    const Tensor logits = stage.logits(0);  // (1, T, V)
    std::FILE* f = std::fopen(argv[2], "wb");
    if (f == nullptr) throw Error(std::string("cannot write ") + argv[2]);
    const size_t n = size_t(T) * size_t(cfg.vocab_size);
    const bool ok = std::fwrite(logits.f32(), sizeof(float), n, f) == n;
    if (std::fclose(f) != 0 || !ok) throw Error(std::string("cannot write ") + argv[2]);
    std::printf("logits %d x %d -> %s\n", T, cfg.vocab_size, argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
