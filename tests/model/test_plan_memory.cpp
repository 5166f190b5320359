// The planner's memory accounting (plan/cost_model.hpp) against the engine it plans for: for
// GPT, llama and the MLP, every tensor degree, recompute mode, precision, stage range and
// number of in-flight micro-batches, the parameters a model::Stage holds and the bytes it asks
// of its allocator are exactly the planner's formulas.
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "model/stage.hpp"
#include "plan/cost_model.hpp"
#include "tests/model/model_test_util.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::model::test::CountingAllocator;
using troupe::model::test::param_store_bytes;

namespace {

ModelConfig config(ModelKind kind) {
  ModelConfig c;
  c.kind = kind;
  c.vocab_size = 64;
  c.seq_len = 8;
  c.d_model = 16;
  c.n_layer = 4;
  c.n_head = 4;
  if (kind == ModelKind::llama) {
    c.n_kv_head = 2;
    c.ffn_hidden = 24;
  }
  if (kind == ModelKind::gpt) c.ffn_hidden = 40;  // not 4 d_model: the width the spec gives
  return c;
}

// The attention troupe's engine runs (model/layers.cpp): what its saved tensors and workspace
// hold is what the planner must price for it.
constexpr plan::AttentionKind kEngineAttention = plan::AttentionKind::fused;

plan::Workload workload_of(const ModelConfig& c, DType dt) {
  plan::Workload w;
  w.attention = kEngineAttention;
  w.model.type = c.kind == ModelKind::gpt     ? ModelType::gpt
                 : c.kind == ModelKind::llama ? ModelType::llama
                                              : ModelType::mlp;
  w.model.n_layers = c.n_layer;
  w.model.d_model = c.d_model;
  w.model.vocab_size = c.vocab_size;
  w.model.seq_len = c.seq_len;
  w.model.n_heads = c.kind != ModelKind::mlp ? c.n_head : 0;
  w.model.n_kv_heads = c.kv_heads();
  w.model.ffn_hidden = int(c.ffn());
  w.model.tie_embeddings = c.tied_head();
  w.compute = dt;
  return w;
}

// tp shards of a stage built at once (threads of a local communicator group), each with its
// own counting allocator.
struct Shards {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::unique_ptr<CountingAllocator>> allocs;
  std::vector<std::unique_ptr<Stage>> stages;
  Shards(const ModelConfig& c, int tp, const LayerRange& r, int slots, int mb, DType dt)
      : comms(size_t(tp)), allocs(size_t(tp)), stages(size_t(tp)) {
    auto world = comm::make_local_world(tp);
    std::vector<std::thread> threads;
    for (int t = 0; t < tp; ++t)
      threads.emplace_back([&, t] {
        comm::CommConfig cc;
        cc.backend = "local";
        cc.rank = t;
        cc.size = tp;
        cc.group = "tp";
        cc.local_world = world;
        comms[size_t(t)] = comm::make_communicator(cc);
        allocs[size_t(t)] = std::make_unique<CountingAllocator>();
        DeviceContext ctx = DeviceContext::cpu();
        ctx.alloc = allocs[size_t(t)].get();
        ctx.compute_dtype = dt;
        stages[size_t(t)] =
            std::make_unique<Stage>(c, r, slots, mb, TensorShard{t, tp}, comms[size_t(t)].get(), ctx);
      });
    for (auto& th : threads) th.join();
  }
};

}  // namespace

TEST_CASE("planner memory: a stage's parameters and allocations are the planner's formulas",
          "[model][plan][memory]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::llama, ModelKind::mlp})
    for (int tp : {1, 2})
      for (DType dt : {DType::f32, DType::bf16})
        for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full})
          for (const LayerRange& r :
               {LayerRange{0, 4, true, true}, LayerRange{0, 2, true, false}, LayerRange{1, 3, false, false},
                LayerRange{2, 4, false, true}, LayerRange{4, 4, false, true}}) {
            ModelConfig c = config(kind);
            c.recompute = mode == Recompute::full;
            const int slots = 3, mb = 2;
            INFO(model_kind_name(kind)
                 << " tp " << tp << " " << dtype_name(dt) << " " << to_string(mode) << " blocks [" << r.first
                 << "," << r.last << ")" << (r.has_embedding ? " +embedding" : "")
                 << (r.has_head ? " +head" : ""));
            Shards s(c, tp, r, slots, mb, dt);
            const plan::Workload w = workload_of(c, dt);
            // Parameters: every shard holds the planner's count.
            const double expect_params = r.n_blocks() * plan::block_params(w.model, tp) +
                                         (r.has_embedding ? plan::embedding_params(w.model, tp) : 0) +
                                         (r.has_head ? plan::head_params(w.model, tp, r.has_embedding) : 0);
            const double expect_bytes =
                plan::stage_activation_bytes(w, r, slots, mb, tp, mode, /*split_backward=*/false);
            for (int t = 0; t < tp; ++t) {
              double params = 0;
              for (const Param& p : s.stages[size_t(t)]->params()) params += double(p.data.numel());
              CHECK(params == expect_params);
              const Stage& st = *s.stages[size_t(t)];
              CHECK(double(s.allocs[size_t(t)]->bytes - param_store_bytes(st.store())) == expect_bytes);
            }
          }
}

TEST_CASE("planner memory: a split backward's kept output gradients are the planner's",
          "[model][plan][memory]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::llama, ModelKind::mlp}) {
    const ModelConfig c = config(kind);
    const LayerRange r{0, 2, true, false};  // the first stage of a pipeline: the embedding, no head
    const int slots = 2, mb = 2, N = mb * c.seq_len;
    INFO(model_kind_name(kind));
    Shards s(c, 1, r, slots, mb, DType::f32);
    Stage& st = *s.stages[0];
    std::vector<int32_t> tokens(size_t(N), 3);
    std::vector<float> dout(size_t(N) * c.d_model, 0.01f);
    for (int slot = 0; slot < slots; ++slot) {
      st.forward(slot, tokens.data(), nullptr, nullptr, mb, c.seq_len);
      st.backward_input(slot, dout.data(), 0.0f);
    }
    CHECK(double(s.allocs[0]->bytes - param_store_bytes(st.store())) ==
          plan::stage_activation_bytes(workload_of(c, DType::f32), r, slots, mb, 1, Recompute::none, true));
  }
}
