// ZeRO building blocks (parallel/zero.hpp) over the local backend, data ranks as threads:
// the bucket parts, the padded reduce-scatter / all-gather against allreduce, and the
// partitioned optimizer against AdamW on the full parameters of a tiny two-stage GPT.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/rng.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/zero.hpp"

using namespace troupe;
using namespace troupe::parallel;

namespace {

// Catch's assertions are not thread-safe: rank threads throw what failed, and the test
// thread checks that no rank did (run_group's errors).
#define EXPECT(cond, what)                                                        \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream os_;                                                     \
      os_ << __FILE__ << ":" << __LINE__ << ": " << #cond << " failed; " << what; \
      throw std::runtime_error(os_.str());                                        \
    }                                                                             \
  } while (0)

const comm::Options kOpt{std::chrono::milliseconds(20000)};

std::unique_ptr<comm::Communicator> local_comm(const std::shared_ptr<comm::LocalWorld>& world, int r, int n) {
  comm::CommConfig cc;
  cc.backend = "local";
  cc.rank = r;
  cc.size = n;
  cc.group = "dp";
  cc.local_world = world;
  cc.timeout = std::chrono::milliseconds(20000);
  return comm::make_communicator(cc);
}

// body(rank, group) on one thread per rank; returns each rank's error ("" when none).
std::vector<std::string> run_group(int n, const std::function<void(int, comm::Communicator&)>& body) {
  auto world = comm::make_local_world(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto c = local_comm(world, r, n);
        body(r, *c);
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void require_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

model::ModelConfig tiny_gpt() {
  model::ModelConfig c;
  c.vocab_size = 256;
  c.d_model = 16;
  c.seq_len = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.seed = 7;
  return c;
}

constexpr int kB = 2, kT = 8;

// Both halves of the tiny GPT, as one pipeline rank with two chunks holds them (the
// second one with the tied copy of wte).
struct TwoStages {
  std::unique_ptr<model::Stage> s0, s1;
  explicit TwoStages(const model::ModelConfig& cfg)
      : s0(std::make_unique<model::Stage>(cfg, LayerRange{0, 1, true, false}, 1, kB)),
        s1(std::make_unique<model::Stage>(cfg, LayerRange{1, 2, false, true}, 1, kB)) {}
  std::vector<model::Stage*> ptrs() const { return {s0.get(), s1.get()}; }
};

// Every parameter of the stages, in stage order: the full optimizer's view.
std::vector<ParamRef> full_refs(const std::vector<model::Stage*>& stages) {
  std::vector<ParamRef> out;
  for (auto* st : stages)
    for (auto& p : st->params())
      out.push_back({p.name, p.data.f32(), p.grad.f32(), size_t(p.data.numel()), p.decay});
  return out;
}

// Random gradients of data rank r at step `step` (padding stays zero).
void fill_grads(const std::vector<model::Stage*>& stages, int r, int step) {
  for (size_t s = 0; s < stages.size(); ++s)
    for (auto& p : stages[s]->params())
      rng::fill_normal(p.grad.f32(), size_t(p.grad.numel()), 1000 * uint64_t(r) + uint64_t(step),
                       rng::name_hash(p.name) + s, 0, 0.0, 1.0);
}

void reduce_all(comm::Communicator& group, const std::vector<model::Stage*>& stages, size_t bucket) {
  for (auto* st : stages) {
    const Tensor& g = st->store().flat_grads();
    reduce_buckets(group, g.f32(), size_t(g.numel()), bucket, kOpt);
  }
}

// The reference layout of a block: local indices [begin, end) along dim of a row-major
// tensor, contiguous (checkpoint::copy_block's).
std::vector<float> block_of(const float* src, const Shape& shape, int dim, int64_t begin, int64_t end) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t ext = shape[size_t(dim)], n = end - begin;
  std::vector<float> out(size_t(outer * n * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k)
        out[size_t((o * n + j) * inner + k)] = src[(o * ext + begin + j) * inner + k];
  return out;
}

bool close(float x, float ref) { return std::fabs(x - ref) <= 1e-6f * std::fabs(ref) + 1e-12f; }

size_t count_close(const float* x, const float* ref, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += close(x[i], ref[i]) ? 0 : 1;
  return bad;
}

}  // namespace

TEST_CASE("bucket parts cover every bucket once and buckets are cut as bucket_begin cuts them",
          "[parallel][zero]") {
  for (int dp = 1; dp <= 5; ++dp)
    for (size_t count = 0; count <= 40; ++count) {
      INFO("dp " << dp << " count " << count);
      const size_t chunk = (count + size_t(dp) - 1) / size_t(dp);
      size_t next = 0;
      for (int d = 0; d < dp; ++d) {
        const auto [b, e] = bucket_part(count, dp, d);
        REQUIRE(b == next);
        REQUIRE(e >= b);
        REQUIRE(e - b <= chunk);
        if (e < count) REQUIRE(e - b == chunk);  // only the last parts are short
        next = e;
      }
      REQUIRE(next == count);
    }
  CHECK(bucket_part(10, 4, 3) == std::pair<size_t, size_t>{9, 10});
  CHECK(bucket_part(5, 4, 3) == std::pair<size_t, size_t>{5, 5});

  for (size_t n = 0; n <= 50; ++n)
    for (size_t bucket = 1; bucket <= 12; ++bucket) {
      INFO("n " << n << " bucket " << bucket);
      std::vector<std::pair<size_t, size_t>> expect;
      for (size_t end = n; end > 0; end = bucket_begin(end, bucket))
        expect.emplace_back(bucket_begin(end, bucket), end);
      REQUIRE(buckets_of(n, bucket) == expect);
    }
  CHECK(buckets_of(10, 4) == std::vector<std::pair<size_t, size_t>>{{6, 10}, {2, 6}, {0, 2}});
}

TEST_CASE("reduce_scatter_bucket gives each rank the allreduce of its part, allgather_bucket the parts",
          "[parallel][zero]") {
  for (int dp : {2, 3, 4}) {
    const std::vector<size_t> counts = {0, 1, size_t(dp) - 1, size_t(dp), 7, 12, 13, 24, 37, 1000, 1001};
    const auto errors = run_group(dp, [&](int r, comm::Communicator& group) {
      std::vector<float> scratch;  // one scratch over every count, as a reducer keeps it
      for (size_t count : counts)
        for (bool integers : {true, false}) {
          const std::string at = "dp " + std::to_string(dp) + " rank " + std::to_string(r) + " count " +
                                 std::to_string(count) + (integers ? " integers" : " normal");
          std::vector<float> g(count);
          if (integers)
            for (size_t i = 0; i < count; ++i) g[i] = float(int((i * 7 + size_t(r) * 13) % 17) - 8);
          else
            rng::fill_normal(g.data(), count, uint64_t(r), count, 0, 0.0, 1.0);
          std::vector<float> sum = g, before = g;
          group.allreduce(sum.data(), count, comm::ReduceOp::sum, kOpt);
          reduce_scatter_bucket(group, g.data(), count, scratch, kOpt);
          const auto [b, e] = bucket_part(count, dp, r);
          for (size_t i = 0; i < count; ++i) {
            const bool mine = i >= b && i < e;
            if (!mine)
              EXPECT(g[i] == 0.0f, at << " float " << i);  // released
            else if (integers)
              EXPECT(g[i] == sum[i], at << " float " << i);
            else
              EXPECT(close(g[i], sum[i]), at << " float " << i);
          }

          // Every rank holds only its part of x (the rest garbage): afterwards all of it.
          std::vector<float> x(count, float(-100 - r));
          for (size_t i = b; i < e; ++i) x[i] = float(i) * 0.5f + 1.0f;
          allgather_bucket(group, x.data(), count, scratch, kOpt);
          for (size_t i = 0; i < count; ++i)
            EXPECT(x[i] == float(i) * 0.5f + 1.0f, at << " gathered float " << i);
        }
    });
    require_no_errors(errors);
  }
}

TEST_CASE("ZeRO pieces cover every parameter float once over the data ranks and never padding",
          "[parallel][zero]") {
  const model::ModelConfig cfg = tiny_gpt();
  TwoStages st(cfg);
  const auto stages = st.ptrs();
  for (int dp = 1; dp <= 4; ++dp)
    for (size_t bucket : {size_t(7), size_t(333), size_t(1000), size_t(1) << 20}) {
      INFO("dp " << dp << " bucket " << bucket);
      // covered[s][flat]: how many ranks own the float; owner[s][flat]: whose part it is.
      std::vector<std::vector<int>> covered(stages.size()), owner(stages.size());
      for (size_t s = 0; s < stages.size(); ++s) {
        const size_t n = size_t(stages[s]->store().flat_params().numel());
        covered[s].assign(n, 0);
        owner[s].assign(n, -1);
        for (const auto& [b0, b1] : buckets_of(n, bucket))
          for (int d = 0; d < dp; ++d) {
            const auto [p0, p1] = bucket_part(b1 - b0, dp, d);
            for (size_t i = b0 + p0; i < b0 + p1; ++i) owner[s][i] = d;
          }
      }
      size_t total = 0;
      for (int d = 0; d < dp; ++d) {
        ZeroPartition part(stages, dp, d, bucket);
        const auto refs = part.refs();
        REQUIRE(refs.size() == part.pieces().size());
        size_t owned = 0, last_stage = 0, last_end = 0;
        for (size_t i = 0; i < part.pieces().size(); ++i) {
          const auto& pc = part.pieces()[i];
          REQUIRE(pc.stage < stages.size());
          const model::Param& p = stages[pc.stage]->params()[pc.param];
          const size_t p_flat = size_t(p.data.f32() - stages[pc.stage]->store().flat_params().f32());
          REQUIRE(pc.len > 0);
          REQUIRE(pc.flat == p_flat + pc.offset);
          REQUIRE(pc.offset + pc.len <= size_t(p.data.numel()));
          if (pc.stage == last_stage && i > 0) REQUIRE(pc.flat >= last_end);  // flat order per stage
          REQUIRE(pc.stage >= last_stage);
          last_stage = pc.stage;
          last_end = pc.flat + pc.len;
          for (size_t k = pc.flat; k < pc.flat + pc.len; ++k) {
            REQUIRE(owner[pc.stage][k] == d);
            ++covered[pc.stage][k];
          }
          CHECK(refs[i].name == p.name);
          CHECK(refs[i].decay == p.decay);
          CHECK(refs[i].data == p.data.f32() + pc.offset);
          CHECK(refs[i].grad == p.grad.f32() + pc.offset);
          CHECK(refs[i].numel == pc.len);
          owned += pc.len;
        }
        REQUIRE(part.owned_floats() == owned);
        total += owned;
        if (dp == 1) {
          size_t n_params = 0;
          for (auto* s : stages) n_params += s->params().size();
          CHECK(part.pieces().size() == n_params);  // one piece per parameter: the plain optimizer
        }
      }
      size_t n_params = 0;
      for (auto* s : stages) n_params += size_t(s->num_params());
      CHECK(total == n_params);
      for (size_t s = 0; s < stages.size(); ++s) {
        std::vector<int> is_param(covered[s].size(), 0);
        for (const auto& p : stages[s]->params()) {
          const size_t f = size_t(p.data.f32() - stages[s]->store().flat_params().f32());
          for (int64_t k = 0; k < p.data.numel(); ++k) is_param[f + size_t(k)] = 1;
        }
        for (size_t k = 0; k < covered[s].size(); ++k) {
          INFO("stage " << s << " float " << k);
          REQUIRE(covered[s][k] == is_param[k]);
        }
      }
    }
}

TEST_CASE("ZeRO stages 1 and 2 update the parameters as AdamW on the full parameters", "[parallel][zero]") {
  const model::ModelConfig cfg = tiny_gpt();
  OptimizerSpec spec;
  spec.lr = 1e-2;
  spec.weight_decay = 0.1;
  constexpr int kSteps = 3;
  for (int dp : {2, 3})
    for (size_t bucket : {size_t(1000), size_t(333), size_t(1) << 20}) {
      INFO("dp " << dp << " bucket " << bucket);
      // [rank][variant][stage]: the flat parameters after the steps (0 full, 1 stage 1, 2 stage 2).
      std::vector<std::vector<std::vector<std::vector<float>>>> out(static_cast<size_t>(dp));
      const auto errors = run_group(dp, [&](int r, comm::Communicator& group) {
        TwoStages ref(cfg), z1(cfg), z2(cfg);
        const auto ref_st = ref.ptrs(), z1_st = z1.ptrs(), z2_st = z2.ptrs();
        AdamW full(spec, full_refs(ref_st));
        ZeroPartition p1(z1_st, dp, r, bucket), p2(z2_st, dp, r, bucket);
        AdamW o1(spec, p1.refs()), o2(spec, p2.refs());
        for (int step = 0; step < kSteps; ++step) {
          const double lr = spec.lr * (1.0 - 0.2 * step);
          for (auto* s : {&ref_st, &z1_st, &z2_st}) fill_grads(*s, r, step);
          reduce_all(group, ref_st, bucket);
          full.step(lr, step + 1);

          reduce_all(group, z1_st, bucket);
          o1.step(lr, step + 1);
          p1.allgather_params(group, kOpt);

          p2.reduce_scatter_grads(group, kOpt);
          o2.step(lr, step + 1);
          p2.allgather_params(group, kOpt);
        }
        auto& mine = out[size_t(r)];
        for (const auto* sts : {&ref_st, &z1_st, &z2_st}) {
          mine.emplace_back();
          for (auto* s : *sts) {
            const Tensor& f = s->store().flat_params();
            mine.back().emplace_back(f.f32(), f.f32() + f.numel());
          }
        }
        // About 1/dp of the buffers: each bucket's part is at most one float over its share.
        size_t flat_floats = 0, n_buckets = 0;
        for (auto* st : z2_st) {
          flat_floats += size_t(st->store().flat_params().numel());
          n_buckets += buckets_of(size_t(st->store().flat_params().numel()), bucket).size();
        }
        EXPECT(p2.owned_floats() * size_t(dp) <= flat_floats + size_t(dp) * n_buckets,
               "owns " << p2.owned_floats());

        // Checkpoint parts of the moments: spread-like and random blocks, dim 0 and 1
        // of 2-D parameters, whole 1-D ones, some parameters not wanted at all.
        rng::Stream pick(77, uint64_t(r));
        struct Want {
          ZeroPartition::MomentPart part;
          std::vector<float> m, v;
          size_t full_index;
        };
        std::vector<Want> wants;
        size_t k = 0;
        for (size_t s = 0; s < z2_st.size(); ++s)
          for (size_t i = 0; i < z2_st[s]->params().size(); ++i, ++k) {
            if (pick.uniform() < 0.25) continue;
            const Shape& shape = z2_st[s]->params()[i].data.shape();
            Want w;
            w.full_index = k;
            w.part.stage = s;
            w.part.param = i;
            if (shape.size() == 2) {
              w.part.dim = int(pick.below(2));
              const int64_t ext = shape[size_t(w.part.dim)];
              if (pick.uniform() < 0.5) {  // what checkpoint::spread gives replica r of dp
                w.part.begin = r * ext / dp;
                w.part.end = (r + 1) * ext / dp;
              } else {
                w.part.begin = int64_t(pick.below(uint64_t(ext) + 1));
                w.part.end = w.part.begin + int64_t(pick.below(uint64_t(ext - w.part.begin) + 1));
              }
            } else {
              w.part.dim = 0;
              w.part.begin = 0;
              w.part.end = shape[0];
            }
            const int64_t rows = w.part.end - w.part.begin;
            const int64_t other = z2_st[s]->params()[i].data.numel() / shape[size_t(w.part.dim)];
            w.m.assign(size_t(rows * other), -1.0f);
            w.v.assign(size_t(rows * other), -1.0f);
            wants.push_back(std::move(w));
          }
        auto gather = [&](const ZeroPartition& part, const AdamW& opt) {
          std::vector<ZeroPartition::MomentPart> req;
          for (auto& w : wants) {
            w.part.m = w.m.data();
            w.part.v = w.v.data();
            req.push_back(w.part);
          }
          part.gather_moment_parts(group, opt, req, kOpt);
        };
        auto expected = [&](const Want& w, const AdamW& opt, bool second) {
          const Shape& shape = ref_st[w.part.stage]->params()[w.part.param].data.shape();
          const auto& mom = second ? opt.v(w.full_index) : opt.m(w.full_index);
          return block_of(mom.f32(), shape, w.part.dim, w.part.begin, w.part.end);
        };
        gather(p2, o2);
        for (const auto& w : wants) {
          const std::string at = ref_st[w.part.stage]->params()[w.part.param].name + " dim " +
                                 std::to_string(w.part.dim) + " [" + std::to_string(w.part.begin) + ", " +
                                 std::to_string(w.part.end) + ")";
          const auto em = expected(w, full, false), ev = expected(w, full, true);
          EXPECT(em.size() == w.m.size(), at);
          EXPECT(count_close(w.m.data(), em.data(), em.size()) == 0, at);
          EXPECT(count_close(w.v.data(), ev.data(), ev.size()) == 0, at);
        }

        // Resume: the full moments -> this rank's pieces, and back through the gather.
        AdamW loaded(spec, p2.refs());
        k = 0;
        for (size_t s = 0; s < ref_st.size(); ++s)
          for (size_t i = 0; i < ref_st[s]->params().size(); ++i, ++k)
            p2.load_param_moments(s, i, full.m(k).f32(), full.v(k).f32(), loaded);
        for (size_t i = 0; i < p2.pieces().size(); ++i) {
          const auto& pc = p2.pieces()[i];
          size_t fk = pc.param + (pc.stage == 1 ? ref_st[0]->params().size() : 0);
          EXPECT(std::memcmp(loaded.m(i).f32(), full.m(fk).f32() + pc.offset, pc.len * sizeof(float)) == 0,
                 "loaded piece " << i);
          EXPECT(std::memcmp(loaded.v(i).f32(), full.v(fk).f32() + pc.offset, pc.len * sizeof(float)) == 0,
                 "loaded piece " << i);
        }
        gather(p2, loaded);
        for (const auto& w : wants) {
          const auto em = expected(w, full, false), ev = expected(w, full, true);
          EXPECT(w.m == em, "after the load, parameter " << w.full_index);
          EXPECT(w.v == ev, "after the load, parameter " << w.full_index);
        }
      });
      require_no_errors(errors);
      if (errors != std::vector<std::string>(static_cast<size_t>(dp))) continue;

      for (int r = 0; r < dp; ++r)
        for (size_t var = 0; var < 3; ++var)
          for (size_t s = 0; s < 2; ++s) {
            INFO("rank " << r << " variant " << var << " stage " << s);
            const auto& x = out[size_t(r)][var][s];
            const auto& ref0 = out[0][var][s];
            CHECK(std::memcmp(x.data(), ref0.data(), x.size() * sizeof(float)) == 0);  // same bits everywhere
            CHECK(count_close(x.data(), out[size_t(r)][0][s].data(), x.size()) == 0);
          }
      // The steps moved the parameters (the comparison above is not of untouched values).
      TwoStages init(cfg);
      const Tensor& f0 = init.s0->store().flat_params();
      CHECK(std::memcmp(f0.f32(), out[0][0][0].data(), size_t(f0.nbytes())) != 0);
    }
}

TEST_CASE("BucketReducer in reduce-scatter mode through backward_overlapped matches reduce_scatter_grads",
          "[parallel][zero]") {
  const model::ModelConfig cfg = tiny_gpt();
  for (int dp : {2, 3})
    for (size_t bucket : {size_t(1000), size_t(333)}) {
      INFO("dp " << dp << " bucket " << bucket);
      const auto errors = run_group(dp, [&](int r, comm::Communicator& group) {
        model::Stage overlapped(cfg, LayerRange::full(cfg.n_layer), 1, kB);
        model::Stage after(cfg, LayerRange::full(cfg.n_layer), 1, kB);
        model::Stage summed(cfg, LayerRange::full(cfg.n_layer), 1, kB);
        rng::Stream s(500, uint64_t(r));
        std::vector<int32_t> tok(kB * kT), tgt(kB * kT);
        for (auto& t : tok) t = int32_t(s.below(256));
        for (auto& t : tgt) t = int32_t(s.below(256));
        const float dloss = 1.0f / float(dp * kB * kT);

        for (int step = 0; step < 2; ++step) {  // the second step reuses the reducer's scratch
          overlapped.zero_grads();
          after.zero_grads();
          {
            BucketReducer reducer(&group, kOpt, bucket, BucketCollective::reduce_scatter);
            overlapped.forward(0, tok.data(), nullptr, tgt.data(), kB, kT);
            reducer.backward_overlapped(overlapped, dloss);
            reducer.wait();
          }
          after.forward(0, tok.data(), nullptr, tgt.data(), kB, kT);
          after.backward(0, nullptr, dloss);
          ZeroPartition part({&after}, dp, r, bucket);
          part.reduce_scatter_grads(group, kOpt);

          summed.zero_grads();
          summed.forward(0, tok.data(), nullptr, tgt.data(), kB, kT);
          summed.backward(0, nullptr, dloss);
          reduce_all(group, {&summed}, bucket);

          const Tensor &a = overlapped.store().flat_grads(), &b = after.store().flat_grads();
          // Owned parts reduced alike; the rest released (zero) on both.
          EXPECT(std::memcmp(a.f32(), b.f32(), a.nbytes()) == 0, "step " << step);
          // ... and the owned parts are the sums over the group.
          EXPECT(part.owned_floats() > 0, "rank " << r);
          for (const auto& pc : part.pieces())
            EXPECT(count_close(a.f32() + pc.flat, summed.store().flat_grads().f32() + pc.flat, pc.len) == 0,
                   "piece at " << pc.flat);
        }
      });
      require_no_errors(errors);
    }
}
