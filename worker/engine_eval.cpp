// Evaluation: the mean loss over train.eval_batches validation batches, every model chunk
// forward only, chained over the pipeline ranks on tags of its own.
#include <string>

#include "worker/engine_impl.hpp"

namespace troupe {

namespace {

// Tags of the forward-only evaluation chain (the training schedule's tags stay below).
constexpr uint32_t kEvalTagBase = 1u << 30;

}  // namespace

// Mean loss over train.eval_batches validation batches. With a pipeline, a forward-only
// chain through the model chunks in order (chunk k on pipeline rank k mod pp); every data
// replica evaluates the same batches.
double Engine::Impl::evaluate() {
  use_device();
  const int Bm = plan.micro_batch;
  const int64_t n_batches = data.num_eval_batches(Bm, T);
  const int n_chunks = plan.partition.n_chunks(), pp = layout().pp;
  const int D = cfg.d_model;
  act.resize(size_t(Bm) * T * D);
  double sum = 0.0;
  for (int k = 0; k < spec.train.eval_batches; ++k) {
    set_where("eval batch " + std::to_string(k));
    data.get_rows(Split::val, k % n_batches, Bm, T, 0, Bm, tokens.data(), targets.data());
    if (!exec) {
      sum += stage_ptrs[0]->forward(0, tokens.data(), nullptr, targets.data(), Bm, T);
      continue;
    }
    for (int chunk = coord().p; chunk < n_chunks; chunk += pp) {
      model::Stage& st = *stage_ptrs[size_t(chunk / pp)];
      const int prev = (coord().p + pp - 1) % pp, next = (coord().p + 1) % pp;
      if (chunk > 0)
        pp_group->recv(act.data(), act.size() * sizeof(float), prev, kEvalTagBase + uint32_t(chunk), copt);
      const bool last = chunk == n_chunks - 1;
      const double l = st.forward(0, chunk == 0 ? tokens.data() : nullptr, chunk == 0 ? nullptr : act.data(),
                                  last ? targets.data() : nullptr, Bm, T);
      if (last)
        sum += l;
      else
        pp_group->send(st.output(0).f32(), act.size() * sizeof(float), next,
                       kEvalTagBase + uint32_t(chunk + 1), copt);
    }
  }
  const bool counts = coord().d == 0 && coord().t == 0 && place.last;
  const double total = world_sum(counts ? sum : 0.0);
  return total / (double(spec.train.eval_batches) * Bm * T);
}

}  // namespace troupe
