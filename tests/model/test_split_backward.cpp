// The split backward of zero-bubble schedules (Stage::backward_input, then
// backward_weights): against backward() on the same micro-batches, every gradient and
// every input_grad is the same bits, for each model kind and stage kind, in f32, in bf16
// and over tensor-parallel shards. Schedules, with slot = micro-batch % slots:
//
//   backward():  F0 F1 F2 b0 b1 b2            (2 slots: F0 F1 b0 F2 b1 b2)
//   split:       F0 F1 F2 B0 B1 W0 B2 W1 W2   (2 slots: F0 F1 B0 B1 W0 F2 B2 W1 W2)
//
// Micro-batches of different B and T, so W must use its own slot's shape.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/stage.hpp"
#include "tests/model/model_test_util.hpp"
#include "tests/model/tp_world.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::model::testing::TpWorld;

namespace {

ModelConfig tiny(ModelKind kind, bool tied = false) {
  ModelConfig c;
  c.kind = kind;
  c.vocab_size = kind == ModelKind::llama ? 48 : 256;
  c.seq_len = 5;
  c.d_model = 16;
  c.n_layer = 3;
  c.n_head = 4;
  if (kind == ModelKind::llama) {
    c.n_kv_head = 2;  // two query heads per key/value head
    c.ffn_hidden = 24;
    c.tie_embeddings = tied;
  }
  c.seed = 99;
  return c;
}

struct Named {
  const char* name;
  ModelConfig cfg;
};
std::vector<Named> models() {
  return {{"gpt", tiny(ModelKind::gpt)},
          {"llama", tiny(ModelKind::llama)},
          {"llama tied", tiny(ModelKind::llama, true)},
          {"mlp", tiny(ModelKind::mlp)}};
}

struct NamedRange {
  const char* name;
  LayerRange range;
};
// Of a 3-block model: the whole of it, and the three stages of a 3-way pipeline.
std::vector<NamedRange> ranges() {
  return {{"full", {0, 3, true, true}},
          {"first", {0, 1, true, false}},
          {"middle", {1, 2, false, false}},
          {"last", {2, 3, false, true}}};
}

struct MicroBatch {
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<float> x, dout;  // (B,T,D): the input of a later stage, dL/d output of an earlier one
};

std::vector<MicroBatch> micro_batches(const ModelConfig& c, int max_B) {
  const int shapes[3][2] = {{max_B, c.seq_len}, {1, c.seq_len - 1}, {max_B, c.seq_len}};
  std::vector<MicroBatch> mbs;
  for (uint64_t m = 0; m < 3; ++m) {
    MicroBatch mb;
    mb.B = shapes[m][0];
    mb.T = shapes[m][1];
    const size_t N = size_t(mb.B) * mb.T, nd = N * size_t(c.d_model);
    rng::Stream s(100 + m, 1);
    for (size_t i = 0; i < N; ++i) {
      mb.tokens.push_back(static_cast<int32_t>(s.below(uint64_t(c.vocab_size))));
      mb.targets.push_back(static_cast<int32_t>(s.below(uint64_t(c.vocab_size))));
    }
    mb.x.resize(nd);
    mb.dout.resize(nd);
    rng::fill_normal(mb.x.data(), nd, 7, m, 0, 0.0, 1.0);
    rng::fill_normal(mb.dout.data(), nd, 8, m, 0, 0.0, 0.1);
    mbs.push_back(std::move(mb));
  }
  return mbs;
}

enum class Op { forward, backward, backward_input, backward_weights };
struct Step {
  Op op;
  int mb;
};

std::vector<Step> schedule(bool split, int n_slots) {
  using O = Op;
  if (!split && n_slots >= 3)
    return {{O::forward, 0},  {O::forward, 1},  {O::forward, 2},
            {O::backward, 0}, {O::backward, 1}, {O::backward, 2}};
  if (!split)
    return {{O::forward, 0}, {O::forward, 1},  {O::backward, 0},
            {O::forward, 2}, {O::backward, 1}, {O::backward, 2}};
  std::vector<Step> s = {{O::forward, 0},        {O::forward, 1},          {O::backward_input, 0},
                         {O::backward_input, 1}, {O::backward_weights, 0}, {O::forward, 2},
                         {O::backward_input, 2}, {O::backward_weights, 1}, {O::backward_weights, 2}};
  if (n_slots >= 3) {  // every forward first
    s.erase(s.begin() + 5);
    s.insert(s.begin() + 2, Step{O::forward, 2});
  }
  return s;
}

std::vector<float> copy_of(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// What a run leaves: every parameter's grad, each micro-batch's input_grad (unless the
// stage has the embedding), and the grads right after micro-batch 0's backward (or B).
struct Result {
  std::vector<std::vector<float>> grads, after_first;
  std::vector<std::vector<float>> input_grad;
};

Result run(Stage& s, const std::vector<MicroBatch>& mbs, bool split) {
  const LayerRange& r = s.range();
  int tokens = 0;
  for (const MicroBatch& mb : mbs) tokens += mb.B * mb.T;
  const float dloss = 1.0f / float(tokens);
  auto grads = [&] {
    std::vector<std::vector<float>> g;
    for (const Param& p : s.params()) g.push_back(copy_of(p.grad));
    return g;
  };
  Result out;
  out.input_grad.resize(mbs.size());
  for (const Step& st : schedule(split, s.n_slots())) {
    const MicroBatch& mb = mbs[size_t(st.mb)];
    const int slot = st.mb % s.n_slots();
    const float* dout = r.has_head ? nullptr : mb.dout.data();
    switch (st.op) {
      case Op::forward:
        s.forward(slot, r.has_embedding ? mb.tokens.data() : nullptr, r.has_embedding ? nullptr : mb.x.data(),
                  r.has_head ? mb.targets.data() : nullptr, mb.B, mb.T);
        break;
      case Op::backward:
      case Op::backward_input:
        if (st.op == Op::backward)
          s.backward(slot, dout, r.has_head ? dloss : 0.0f);
        else
          s.backward_input(slot, dout, r.has_head ? dloss : 0.0f);
        if (!r.has_embedding) out.input_grad[size_t(st.mb)] = copy_of(s.input_grad(slot));
        if (st.mb == 0) out.after_first = grads();
        break;
      case Op::backward_weights:
        s.backward_weights(slot);
        break;
    }
  }
  out.grads = grads();
  return out;
}

// The grads B leaves for W: the Linears' weights, and where one stage holds both the
// embedding and the tied head, the embedding's (wte, wpe) too.
bool left_for_w(const std::string& name, const Stage& s) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const LayerRange& r = s.range();
  const bool tied_head = r.has_head && s.config().tied_head();
  if (ends_with("c_attn.weight") || ends_with("c_proj.weight") || ends_with("c_fc.weight") ||
      name == "lm_head.weight" || (tied_head && name == "wte.weight"))
    return true;
  return tied_head && r.has_embedding && name == "wpe.weight";
}

bool all_zero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f) return false;
  return true;
}

bool has_nonzero(const std::vector<std::vector<float>>& vs) {
  for (const auto& v : vs)
    if (!all_zero(v)) return true;
  return false;
}

// Same values, compared with ==.
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

void check_split_equals_backward(const Stage& s, const Result& ref, const Result& split) {
  const auto& ps = s.params();
  REQUIRE(ref.grads.size() == ps.size());
  REQUIRE(split.grads.size() == ps.size());
  CHECK(has_nonzero(ref.grads));
  for (size_t i = 0; i < ps.size(); ++i) {
    INFO(ps[i].name);
    CHECK(same(split.grads[i], ref.grads[i]));
    // After micro-batch 0's B: what backward() leaves, but for what W has still to add.
    if (left_for_w(ps[i].name, s))
      CHECK(all_zero(split.after_first[i]));
    else
      CHECK(same(split.after_first[i], ref.after_first[i]));
  }
  for (size_t m = 0; m < ref.input_grad.size(); ++m) {
    INFO("input_grad of micro-batch " << m);
    CHECK(same(split.input_grad[m], ref.input_grad[m]));
    if (!s.range().has_embedding) CHECK(!all_zero(ref.input_grad[m]));
  }
}

DeviceContext computing_in(DType dt) {
  DeviceContext c = DeviceContext::cpu();
  c.compute_dtype = dt;
  return c;
}

void check_every_model_and_stage(const DeviceContext& ctx, const std::vector<int>& slot_counts) {
  const int max_B = 2;
  for (const Named& m : models())
    for (const NamedRange& r : ranges())
      for (int slots : slot_counts) {
        INFO(m.name << ", " << r.name << " stage, " << slots << " slots, " << dtype_name(ctx.compute_dtype));
        const auto mbs = micro_batches(m.cfg, max_B);
        Stage a(m.cfg, r.range, slots, max_B, ctx), b(m.cfg, r.range, slots, max_B, ctx);
        const Result ref = run(a, mbs, false);
        CHECK(b.deferred_bytes() == 0);
        const Result split = run(b, mbs, true);
        CHECK(b.deferred_bytes() > 0);
        CHECK(a.deferred_bytes() == 0);  // backward() keeps nothing
        check_split_equals_backward(b, ref, split);
      }
}

}  // namespace

TEST_CASE("split backward: B then W leaves backward's grads and input_grad, every model and stage",
          "[model][split]") {
  check_every_model_and_stage(DeviceContext::cpu(), {2, 3});
}

TEST_CASE("split backward: the same bits in mixed precision (bf16)", "[model][split]") {
  check_every_model_and_stage(computing_in(DType::bf16), {2});
}

TEST_CASE("split backward: the same bits on each tensor-parallel shard (tp 2)", "[model][split]") {
  const int tp = 2, slots = 2, max_B = 2;
  for (const Named& m : models()) {
    if (m.cfg.kind == ModelKind::mlp) continue;  // the same MLP sublayer as gpt's
    for (const NamedRange& r : ranges()) {
      INFO(m.name << ", " << r.name << " stage, tp " << tp);
      const auto mbs = micro_batches(m.cfg, max_B);
      TpWorld a(m.cfg, tp, r.range, slots, max_B), b(m.cfg, tp, r.range, slots, max_B);
      std::vector<Result> ref(tp), split(tp);
      a.run([&](int q, Stage& st) { ref[size_t(q)] = run(st, mbs, false); });
      b.run([&](int q, Stage& st) { split[size_t(q)] = run(st, mbs, true); });
      for (int q = 0; q < tp; ++q) {
        INFO("shard " << q);
        check_split_equals_backward(b[q], ref[size_t(q)], split[size_t(q)]);
      }
    }
  }
}

TEST_CASE("split backward: the kept output gradients, per slot on first use, sized for max_micro_batch",
          "[model][split]") {
  // gpt, whole model: per block c_attn (3D), attn.c_proj (D), mlp.c_fc (4D), mlp.c_proj (D)
  // outputs, plus the embedding's gradient (D) waiting for the tied head's product; the
  // head's dlogits is recomputed, not kept.
  const ModelConfig c = tiny(ModelKind::gpt);
  const int max_B = 3, slots = 3;
  const size_t N = size_t(max_B) * c.seq_len, D = size_t(c.d_model);
  const size_t per_slot = (size_t(c.n_layer) * 9 * D + D) * N * sizeof(float);
  test::CountingAllocator counted;
  DeviceContext ctx = DeviceContext::cpu();
  ctx.alloc = &counted;
  Stage s(c, LayerRange::full(c.n_layer), slots, max_B, ctx);
  const auto mbs = micro_batches(c, 2);  // smaller than max_micro_batch
  const size_t before = counted.bytes;
  CHECK(s.deferred_bytes() == 0);
  s.forward(1, mbs[0].tokens.data(), nullptr, mbs[0].targets.data(), mbs[0].B, mbs[0].T);
  s.backward(1, nullptr, 0.1f);
  CHECK(s.deferred_bytes() == 0);
  s.backward_input(1, nullptr, 0.1f);  // a second backward of the same forward is allowed
  CHECK(s.deferred_bytes() == per_slot);
  CHECK(counted.bytes - before == per_slot);
  s.backward_weights(1);
  s.forward(1, mbs[1].tokens.data(), nullptr, mbs[1].targets.data(), mbs[1].B, mbs[1].T);
  s.backward_input(1, nullptr, 0.1f);
  CHECK(s.deferred_bytes() == per_slot);  // allocated once per slot
  s.forward(2, mbs[2].tokens.data(), nullptr, mbs[2].targets.data(), mbs[2].B, mbs[2].T);
  s.backward_input(2, nullptr, 0.1f);
  CHECK(s.deferred_bytes() == 2 * per_slot);
  CHECK(counted.bytes - before == 2 * per_slot);

  // A llama middle stage: c_attn (NH + 2 NKV) HS, c_proj D, gate|up 2F, down D per block.
  const ModelConfig l = tiny(ModelKind::llama);
  Stage m(l, {1, 2, false, false}, 1, max_B);
  const auto lmbs = micro_batches(l, 1);
  const MicroBatch& mb = lmbs[0];
  m.forward(0, nullptr, mb.x.data(), nullptr, mb.B, mb.T);
  m.backward_input(0, mb.dout.data(), 0.0f);
  const size_t qkv = size_t(l.n_head + 2 * l.n_kv_head) * size_t(l.head_dim());
  CHECK(m.deferred_bytes() == (qkv + D + 2 * size_t(l.ffn_hidden) + D) * N * sizeof(float));
}

TEST_CASE("split backward: refused under recomputation, and slots with weight gradients pending",
          "[model][split]") {
  ModelConfig rc = tiny(ModelKind::gpt);
  rc.recompute = true;
  const auto mbs = micro_batches(rc, 1);
  const MicroBatch& mb = mbs[0];
  Stage r(rc, LayerRange::full(rc.n_layer), 2, 1);
  r.forward(0, mb.tokens.data(), nullptr, mb.targets.data(), mb.B, mb.T);
  CHECK_THROWS_AS(r.backward_input(0, nullptr, 0.1f), Error);
  CHECK_THROWS_WITH(r.backward_input(0, nullptr, 0.1f),
                    Catch::Contains("the split backward (zero-bubble schedules) needs every block's saved "
                                    "activations: train.recompute is not supported with it"));

  const ModelConfig c = tiny(ModelKind::gpt);
  Stage s(c, LayerRange::full(c.n_layer), 4, 1);
  CHECK_THROWS_WITH(s.backward_weights(3), Catch::Contains("backward_weights(3) without a backward_input"));
  s.forward(3, mb.tokens.data(), nullptr, mb.targets.data(), mb.B, mb.T);
  CHECK_THROWS_WITH(s.backward_weights(3), Catch::Contains("backward_weights(3) without a backward_input"));
  s.backward_input(3, nullptr, 0.1f);
  CHECK_THROWS_AS(s.forward(3, mb.tokens.data(), nullptr, mb.targets.data(), mb.B, mb.T), Error);
  CHECK_THROWS_WITH(
      s.forward(3, mb.tokens.data(), nullptr, mb.targets.data(), mb.B, mb.T),
      Catch::Contains("forward(3) while the slot's weight gradients are pending: backward_weights "
                      "first"));
  CHECK_THROWS_WITH(s.backward_input(3, nullptr, 0.1f), Catch::Contains("pending"));
  CHECK_THROWS_WITH(s.backward(3, nullptr, 0.1f), Catch::Contains("pending"));
  s.backward_weights(3);
  CHECK_THROWS_WITH(s.backward_weights(3), Catch::Contains("without a backward_input"));
  CHECK_NOTHROW(s.forward(3, mb.tokens.data(), nullptr, mb.targets.data(), mb.B, mb.T));
}
