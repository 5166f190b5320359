#include "parallel/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <future>

#include "core/error.hpp"
#include "core/trace.hpp"

namespace troupe::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A traced span of [t0, t1) on `track` (callers test traced() first: its arguments allocate).
void trace_span(trace::Recorder* r, const char* cat, std::string name, Clock::time_point t0,
                Clock::time_point t1, int track, std::vector<std::pair<std::string, std::string>> args = {}) {
  if (r == nullptr || !r->active()) return;
  trace::Span s;
  s.cat = cat;
  s.name = std::move(name);
  s.ts_us = r->to_us(t0);
  s.dur_us = std::max<int64_t>(0, r->to_us(t1) - s.ts_us);
  s.track = track;
  s.args = std::move(args);
  r->add(std::move(s));
}

std::vector<std::pair<std::string, std::string>> batch_args(const std::vector<comm::P2POp>& ops) {
  size_t sends = 0, bytes = 0;
  for (const comm::P2POp& op : ops) {
    sends += op.kind == comm::P2POp::Kind::send ? 1 : 0;
    bytes += op.bytes;
  }
  return {{"op", "p2p"},
          {"group", "pp"},
          {"sends", std::to_string(sends)},
          {"recvs", std::to_string(ops.size() - sends)},
          {"bytes", std::to_string(bytes)}};
}

}  // namespace

plan::ModelShape shape_of(const model::ModelConfig& cfg) {
  const ModelType type = cfg.kind == model::ModelKind::gpt     ? ModelType::gpt
                         : cfg.kind == model::ModelKind::llama ? ModelType::llama
                                                               : ModelType::mlp;
  plan::ModelShape m{type, cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.seq_len};
  m.n_heads = cfg.kind != model::ModelKind::mlp ? cfg.n_head : 0;
  m.n_kv_heads = cfg.kv_heads();
  m.ffn_hidden = static_cast<int>(cfg.ffn());
  m.tie_embeddings = cfg.tied_head();
  return m;
}

std::vector<std::unique_ptr<model::Stage>> make_rank_stages(
    const model::ModelConfig& cfg, const plan::Partition& part, int rank, const plan::CheckResult& check,
    int max_micro_batch, const model::TensorShard& shard, comm::Communicator* tp_group,
    const model::DeviceContext& ctx) {
  TROUPE_CHECK(rank >= 0 && rank < part.pp, "pipeline rank ", rank, " outside a partition of ", part.pp);
  TROUPE_CHECK(part.pp == 1 || (static_cast<int>(check.peak_in_flight.size()) == part.pp &&
                                static_cast<int>(check.peak_in_flight[rank].size()) == part.virtual_stages),
               "the checked schedule is for another pipeline shape than the partition (pipeline ", part.pp,
               " x virtual ", part.virtual_stages, ")");
  std::vector<std::unique_ptr<model::Stage>> out;
  for (int c = 0; c < part.virtual_stages; ++c) {
    const LayerRange& r = part.of(rank, c);
    const int slots = plan::activation_slots(check, part.pp, rank, c);
    out.push_back(std::make_unique<model::Stage>(cfg, r, slots, max_micro_batch, shard, tp_group, ctx));
  }
  return out;
}

PipelineExecutor::PipelineExecutor(plan::Schedule schedule, int rank, std::vector<model::Stage*> stages,
                                   comm::Communicator* comm, int micro_batch, int seq_len,
                                   comm::Options options)
    : PipelineExecutor(schedule, plan::check_schedule(schedule), rank, std::move(stages), comm, micro_batch,
                       seq_len, options) {}

PipelineExecutor::PipelineExecutor(plan::Schedule schedule, plan::CheckResult checked, int rank,
                                   std::vector<model::Stage*> stages, comm::Communicator* comm,
                                   int micro_batch, int seq_len, comm::Options options)
    : schedule_(std::move(schedule)),
      rank_(rank),
      stages_(std::move(stages)),
      comm_(comm),
      B_(micro_batch),
      T_(seq_len),
      options_(options),
      check_(std::move(checked)) {
  const plan::Schedule& s = schedule_;
  TROUPE_CHECK(rank >= 0 && rank < s.pp, "pipeline rank ", rank, " outside pipeline ", s.pp);
  TROUPE_CHECK(static_cast<int>(stages_.size()) == s.v, "pipeline rank ", rank, " has ", stages_.size(),
               " stages for a schedule of ", s.v, " chunks per rank");
  TROUPE_CHECK(s.pp == 1 || comm_, "a pipeline of ", s.pp, " ranks needs a communicator");
  if (comm_)
    TROUPE_CHECK(comm_->size() == s.pp && comm_->rank() == rank, "the pipeline communicator is rank ",
                 comm_->rank(), " of ", comm_->size(), ", the executor pipeline rank ", rank, " of ", s.pp);
  TROUPE_CHECK(static_cast<int>(check_.peak_in_flight.size()) == s.pp, "the schedule's check is for ",
               check_.peak_in_flight.size(), " pipeline ranks, the table for ", s.pp);
  const int S = s.n_chunks();
  for (int c = 0; c < s.v; ++c) {
    model::Stage* st = stages_[c];
    TROUPE_CHECK(st, "stage of chunk ", c, " is null");
    const int k = c * s.pp + rank;
    TROUPE_CHECK(st->range().has_embedding == (k == 0) && st->range().has_head == (k == S - 1),
                 "model chunk ", k, " of ", S,
                 ": the stage must hold the embedding iff it is the first chunk and "
                 "the head iff it is the last");
    TROUPE_CHECK(st->n_slots() >= check_.peak_in_flight[rank][c], "chunk ", c, " of pipeline rank ", rank,
                 " has ", st->n_slots(), " activation slots; the ", plan::schedule_name(s.kind),
                 " schedule keeps ", check_.peak_in_flight[rank][c], " micro-batches in flight there");
    TROUPE_CHECK(B_ >= 1 && B_ <= st->max_micro_batch() && T_ >= 1 && T_ <= st->config().seq_len,
                 "micro-batch ", B_, " x ", T_, " does not fit the stage's ", st->max_micro_batch(), " x ",
                 st->config().seq_len);
  }
  numel_ = static_cast<size_t>(B_) * T_ * stages_[0]->config().d_model;
  program_ = plan::rank_program(s, rank);
  free_slots_.resize(s.v);
  slot_of_.resize(s.v);
}

bool PipelineExecutor::traced() const { return tracer_ != nullptr && tracer_->active(); }

float* PipelineExecutor::inbox(uint32_t tag) {
  auto& buf = inbox_[tag];
  if (buf.empty()) {
    if (!spare_.empty()) {
      buf = std::move(spare_.back());
      spare_.pop_back();
    } else {
      buf.resize(numel_);
    }
  }
  return buf.data();
}

const float* PipelineExecutor::send_buffer(const plan::Transfer& t) {
  // Activations come from F of chunk dest-1, gradients from B of chunk dest+1.
  const int src = t.carry == plan::Carry::activation ? t.dest - 1 : t.dest + 1;
  const int c = src / schedule_.pp;
  const int slot = slot_of_[c].at(t.mb);
  return t.carry == plan::Carry::activation ? stages_[c]->output(slot).f32()
                                            : stages_[c]->input_grad(slot).f32();
}

std::vector<comm::P2POp> PipelineExecutor::post(const std::vector<plan::Transfer>& batch) {
  std::vector<comm::P2POp> ops;
  const size_t bytes = numel_ * sizeof(float);
  for (const plan::Transfer& t : batch)
    ops.push_back(t.send ? comm::P2POp::send(send_buffer(t), bytes, t.peer, t.tag)
                         : comm::P2POp::recv(inbox(t.tag), bytes, t.peer, t.tag));
  return ops;
}

void PipelineExecutor::exchange(const std::vector<plan::Transfer>& batch) {
  const std::vector<comm::P2POp> ops = post(batch);
  const auto t0 = Clock::now();
  comm_->batch(ops, options_);
  if (traced()) trace_span(tracer_, "comm", "p2p batch", t0, Clock::now(), trace::kEngine, batch_args(ops));
  batch_done();
}

void PipelineExecutor::batch_done() {
  for (auto [c, mb] : to_free_) {
    free_slots_[c].push_back(slot_of_[c].at(mb));
    slot_of_[c].erase(mb);
  }
  to_free_.clear();
}

void PipelineExecutor::compute(const plan::Op& op, const MicroBatchSource& data, float dloss,
                               PipelineStepResult& res) {
  model::Stage& st = *stages_[op.chunk];
  const int k = op.chunk * schedule_.pp + rank_;
  const int S = schedule_.n_chunks();
  auto take_inbox = [&](plan::Carry carry) {
    auto it = inbox_.find(plan::transfer_tag(carry, op.mb, k, S));
    TROUPE_CHECK(it != inbox_.end(), "pipeline rank ", rank_, ": ", to_string(op), " has no received input");
    return it;
  };
  auto release = [&](std::map<uint32_t, std::vector<float>>::iterator it) {
    spare_.push_back(std::move(it->second));
    inbox_.erase(it);
  };
  if (op.pass == plan::Pass::F) {
    auto& fs = free_slots_[op.chunk];
    TROUPE_CHECK(!fs.empty(), "pipeline rank ", rank_, ": no free slot for ", to_string(op));
    const int slot = fs.back();
    fs.pop_back();
    slot_of_[op.chunk][op.mb] = slot;
    MicroBatch mb;
    if (st.range().has_embedding || st.range().has_head) mb = data(op.mb);
    const bool first = st.range().has_embedding, last = st.range().has_head;
    TROUPE_CHECK(!first || mb.tokens, "micro-batch ", op.mb, " has no tokens for the first stage");
    TROUPE_CHECK(!last || mb.targets, "micro-batch ", op.mb, " has no targets for the last stage");
    std::map<uint32_t, std::vector<float>>::iterator in;
    if (!first) in = take_inbox(plan::Carry::activation);
    const double loss = st.forward(slot, first ? mb.tokens : nullptr, first ? nullptr : in->second.data(),
                                   last ? mb.targets : nullptr, B_, T_);
    if (!first) release(in);
    if (last) res.loss_sum += loss;
  } else if (op.pass == plan::Pass::W) {
    // The weight gradients of a split backward. rank_program placed this op after the batch
    // that sends the micro-batch's input gradient; while that batch is still in flight (run()
    // overlaps it) the slot is given back once it is done, before any later F.
    const int slot = slot_of_[op.chunk].at(op.mb);
    st.backward_weights(slot);
    if (overlapping_) {
      to_free_.push_back({op.chunk, op.mb});
    } else {
      free_slots_[op.chunk].push_back(slot);
      slot_of_[op.chunk].erase(op.mb);
    }
  } else {
    const int slot = slot_of_[op.chunk].at(op.mb);
    // A split schedule's B is the input gradient only: the slot stays until its W.
    const bool split = schedule_.split_backward();
    auto backward = [&](const float* dout, float dl) {
      if (split)
        st.backward_input(slot, dout, dl);
      else
        st.backward(slot, dout, dl);
    };
    if (st.range().has_head) {
      backward(nullptr, dloss);
    } else {
      auto it = take_inbox(plan::Carry::gradient);
      backward(it->second.data(), 0.0f);
      release(it);
    }
    if (split) return;
    if (k == 0) {
      free_slots_[op.chunk].push_back(slot);
      slot_of_[op.chunk].erase(op.mb);
    } else {
      to_free_.push_back({op.chunk, op.mb});  // input_grad(slot) leaves in the next batch
    }
  }
}

PipelineStepResult PipelineExecutor::run(const MicroBatchSource& data, float dloss) {
  const auto t_step = Clock::now();
  PipelineStepResult res;
  const int S = schedule_.n_chunks();
  res.has_loss = rank_ == (S - 1) % schedule_.pp;
  for (int c = 0; c < schedule_.v; ++c) {
    auto& fs = free_slots_[c];
    fs.clear();
    for (int i = stages_[c]->n_slots() - 1; i >= 0; --i) fs.push_back(i);
    slot_of_[c].clear();
  }
  to_free_.clear();
  for (auto& [tag, buf] : inbox_) spare_.push_back(std::move(buf));
  inbox_.clear();
  for (size_t i = 0; i < program_.size(); ++i) {
    at_.store(static_cast<int>(i));
    const plan::ProgramStep& st = program_[i];
    const auto t0 = Clock::now();
    if (st.compute) {
      compute(st.op, data, dloss, res);
      res.timing.compute_ms += ms_since(t0);
      if (traced())
        trace_span(tracer_, "compute", plan::to_string(st.op), t0, Clock::now(), trace::kEngine,
                   {{"mb", std::to_string(st.op.mb)}, {"chunk", std::to_string(st.op.chunk)}});
      continue;
    }
    // The W's right after a batch need nothing it carries: they run while it is in flight
    // (what check_schedule simulates). The buffers are resolved here, before the W's free
    // slots; only the communicator is used on the other thread.
    size_t w_end = i + 1;
    while (w_end < program_.size() && program_[w_end].compute && program_[w_end].op.pass == plan::Pass::W)
      ++w_end;
    if (w_end == i + 1) {
      exchange(st.batch);
      res.timing.comm_ms += ms_since(t0);
      continue;
    }
    std::vector<comm::P2POp> ops = post(st.batch);
    Clock::time_point batch_end;
    auto in_flight = std::async(std::launch::async, [&] {
      comm_->batch(ops, options_);
      batch_end = Clock::now();
    });
    double w_ms = 0.0;
    overlapping_ = true;
    try {
      for (size_t j = i + 1; j < w_end; ++j) {
        // A batch that failed (an aborted group, a dead peer) stops the W's at once.
        if (in_flight.valid() && in_flight.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
          in_flight.get();
        at_.store(static_cast<int>(j));
        const auto tw = Clock::now();
        compute(program_[j].op, data, dloss, res);
        w_ms += ms_since(tw);
        if (traced())
          trace_span(
              tracer_, "compute", plan::to_string(program_[j].op), tw, Clock::now(), trace::kEngine,
              {{"mb", std::to_string(program_[j].op.mb)}, {"chunk", std::to_string(program_[j].op.chunk)}});
      }
    } catch (...) {
      overlapping_ = false;
      // The batch's buffers must outlive its transfers: wait for it (it ends, by its peers
      // or by the communicator's deadline or abort) before the error leaves.
      if (in_flight.valid()) try {
          in_flight.get();
        } catch (...) {
        }
      throw;
    }
    overlapping_ = false;
    const auto w_done = Clock::now();
    if (in_flight.valid()) in_flight.get();
    // The batch on its own track; the engine waits for what is left of it after the W's.
    if (traced()) {
      trace_span(tracer_, "comm", "p2p batch", t0, batch_end, trace::kPipelineComm, batch_args(ops));
      if (batch_end > w_done)
        trace_span(tracer_, "comm", "p2p batch (rest)", w_done, batch_end, trace::kEngine);
    }
    batch_done();  // frees the slots of this batch's gradients and of the W's
    res.timing.compute_ms += w_ms;
    res.timing.comm_ms += std::max(0.0, ms_since(t0) - w_ms);
    i = w_end - 1;
  }
  at_.store(-1);
  res.timing.step_ms = ms_since(t_step);
  res.timing.bubble_ms = std::max(0.0, res.timing.step_ms - res.timing.compute_ms);
  return res;
}

std::string PipelineExecutor::where() const {
  const int i = at_.load();
  std::string s = "pipeline rank " + std::to_string(rank_) + ": ";
  if (i < 0 || i >= static_cast<int>(program_.size())) return s + "idle";
  if (program_[i].compute) return s + to_string(program_[i].op);
  for (size_t j = i + 1; j < program_.size(); ++j)
    if (program_[j].compute) return s + "batch before " + to_string(program_[j].op);
  return s + "last batch";
}

void allreduce_tied_embedding(const std::vector<model::Stage*>& stages, comm::Communicator* embedding_group,
                              const comm::Options& options) {
  if (!embedding_group || embedding_group->size() == 1) return;
  // This rank's end of the tie: the embedding's wte.weight (first chunk) or the LM
  // head's copy of it (last chunk, Param::tied_copy).
  model::Param* held = nullptr;
  for (model::Stage* st : stages)
    for (model::Param& p : st->params())
      if (p.tied_copy || (p.name == "wte.weight" && st->range().has_embedding)) {
        TROUPE_CHECK(!held, "two chunks of one rank hold wte.weight: the embedding group is for two ranks");
        held = &p;
      }
  TROUPE_CHECK(held, "rank ", embedding_group->rank(), " of the embedding group holds no wte.weight");
  Tensor& g = held->grad;
  embedding_group->allreduce(g.f32(), static_cast<size_t>(g.numel()), comm::ReduceOp::sum, options);
}

}  // namespace troupe::parallel
