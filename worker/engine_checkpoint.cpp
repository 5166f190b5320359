// The rank's checkpoint: its snapshot (what it holds of each tensor, ZeRO's moments gathered
// from their owners), the write and its commit (in the background under checkpoint.async),
// and the way back: resume from a checkpoint of any layout, model.init_from.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/hf.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "worker/engine_impl.hpp"

namespace troupe {

namespace {

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

// What this rank holds of a parameter, in the checkpoint's terms.
checkpoint::SliceSpec Engine::Impl::held_slice(const model::Param& p) {
  checkpoint::SliceSpec s{p.global_shape, p.split_dim, {}};
  for (const auto& pc : p.slice_pieces()) s.pieces.push_back({pc.offset, pc.length, pc.local_offset});
  return s;
}

// model.init_from (checkpoint::hf::init_source: a Hugging Face directory, a checkpoint of any
// layout, a safetensors file): only parameters are read, each rank reading just its slices.
void Engine::Impl::init_from(const std::string& path) {
  const checkpoint::hf::SliceReader read = checkpoint::hf::init_source(path, spec);
  for (auto* p : params) load_into(p->data, [&](float* out) { read(p->name, held_slice(*p), out); });
}

// Resuming under any layout: after the manifest and every checksum verify, each rank
// reads its slices of the parameters and of both AdamW moments from whichever shards
// hold them, and continues at the checkpoint's step.
void Engine::Impl::resume(const std::string& dir) {
  checkpoint::TensorSource src(checkpoint::resolve(dir), checkpoint::Verify::on_read);
  TROUPE_CHECK(src.manifest().has_value(), dir, ": not a checkpoint directory");
  std::vector<float> m, v;  // ZeRO: one parameter's whole moments at a time
  size_t i = 0;
  for (size_t c = 0; c < stage_ptrs.size(); ++c)
    for (size_t j = 0; j < stage_ptrs[c]->params().size(); ++j, ++i) {
      model::Param& p = *params[i];
      const checkpoint::SliceSpec want = held_slice(p);
      load_into(p.data, [&](float* out) { src.read_slice(p.name, want, out); });
      if (!zpart) {
        load_into(opt->m(i), [&](float* out) { src.read_slice("optim.m." + p.name, want, out); });
        load_into(opt->v(i), [&](float* out) { src.read_slice("optim.v." + p.name, want, out); });
        continue;
      }
      m.resize(size_t(p.data.numel()));
      v.resize(m.size());
      src.read_slice("optim.m." + p.name, want, m.data());
      src.read_slice("optim.v." + p.name, want, v.data());
      zpart->load_param_moments(c, j, m.data(), v.data(), *opt);
    }
  next_step = src.manifest()->step;
  restore_loss_scale(src.manifest()->loss_scale, dir);
}

// A checkpoint's loss-scaler state (null: it never scaled nor skipped). Restored in
// every precision: AdamW's step count leaves out the skipped steps.
void Engine::Impl::restore_loss_scale(const nlohmann::json& j, const std::string& dir) {
  if (j.is_null()) return;
  try {
    parallel::LossScaleState st;
    st.scale = j.at("scale").get<double>();
    st.clean_steps = j.at("clean_steps").get<int64_t>();
    st.skipped_steps = j.at("skipped_steps").get<int64_t>();
    scaler.restore(st);
  } catch (const nlohmann::json::exception& e) {
    throw Error(dir + ": malformed loss_scale in the manifest: " + e.what());
  }
}

std::string Engine::Impl::manifest_json() const {
  checkpoint::Manifest m;
  m.step = next_step;
  m.data_cursor = next_step;
  m.dp = layout().dp;
  m.pp = layout().pp;
  m.tp = layout().tp;
  m.seed = spec.train.seed;
  m.spec_yaml = to_yaml(spec);
  m.spec_hash = hex64(rng::name_hash(m.spec_yaml));
  const auto& o = spec.train.optimizer;
  m.optimizer = {{"type", o.type},   {"lr", o.lr},   {"beta1", o.beta1},
                 {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
  const parallel::LossScaleState& ls = scaler.state();
  if (scaler.enabled() || ls.skipped_steps > 0)
    m.loss_scale = {
        {"scale", ls.scale}, {"clean_steps", ls.clean_steps}, {"skipped_steps", ls.skipped_steps}};
  return checkpoint::to_json(m).dump();
}

// What this rank holds, each tensor once. A split tensor is replicated over the
// data-parallel group, a whole one over data and tensor groups: the replicas share
// its bytes out.
// ZeRO: the moments of each stored part are gathered from their owners over the data group
// (collective: every data replica snapshots the same step) straight into the snapshot's parts.
checkpoint::ShardSnapshot Engine::Impl::snapshot(const std::string& root) const {
  std::vector<checkpoint::HeldTensor> held;
  std::vector<parallel::ZeroPartition::MomentPart> wants;
  held.reserve(params.size());
  size_t i = 0;
  for (size_t c = 0; c < stage_ptrs.size(); ++c)
    for (size_t j = 0; j < stage_ptrs[c]->params().size(); ++j) {
      const model::Param& p = stage_ptrs[c]->params()[j];
      const size_t k = i++;
      if (p.tied_copy) continue;  // stored once, by the first stage
      const bool split = p.split_dim >= 0;
      checkpoint::HeldTensor t{p.name,
                               held_slice(p),
                               p.data.shape(),
                               host_view(p.data, 3 * k),
                               nullptr,
                               nullptr,
                               split ? coord().d : coord().d * layout().tp + coord().t,
                               split ? layout().dp : layout().dp * layout().tp,
                               {},
                               {}};
      if (!zpart) {
        t.m = host_view(opt->m(k), 3 * k + 1);
        t.v = host_view(opt->v(k), 3 * k + 2);
      } else {
        const checkpoint::Spread part = checkpoint::spread(t.held, t.replica, t.replicas);
        const int64_t rows = std::max<int64_t>(0, part.end - part.begin);
        const size_t n = rows > 0 ? size_t(p.data.numel() / p.data.size(part.dim) * rows) : 0;
        t.m_part.resize(n);
        t.v_part.resize(n);
        wants.push_back({c, j, part.dim, part.begin, part.end, t.m_part.data(), t.v_part.data()});
      }
      held.push_back(std::move(t));  // a moved vector keeps its buffer
    }
  if (zpart) zpart->gather_moment_parts(*dp_group, *opt, wants, copt);
  return checkpoint::snapshot_shard(root, next_step, asg.rank, world_size(), asg.generation, layout().str(),
                                    spec.checkpoint.keep, std::move(held), manifest_json());
}

// Every rank waits until every rank arrived: the groups' barriers in turn (after the tensor
// group's, each rank of a pipeline group stands for its whole tensor group; after the
// pipeline group's, for its whole replica).
void Engine::Impl::grid_barrier() {
  for (comm::Communicator* g : grid_groups())
    if (g) g->barrier(copt);
}

// Writes the snapshot (fsynced), reports it and returns the committed directory. With
// one rank and no committer the engine commits by itself.
std::string Engine::Impl::write_snapshot(const checkpoint::ShardSnapshot& s) {
  const checkpoint::ShardReport rep = checkpoint::write_snapshot(s);
  if (asg.commit_shard) return asg.commit_shard(rep);
  checkpoint::CommitTracker one;
  if (world_size() == 1) {
    auto ready = one.add("self", rep);
    return checkpoint::commit(ready->root, ready->manifest, ready->keep);
  }
  // No committer: the ranks meet at barriers (save() keeps this path synchronous) and
  // rank 0 commits what every rank wrote.
  grid_barrier();
  const std::string dir = s.root + "/" + checkpoint::step_dir_name(s.step);
  if (asg.rank == 0) {
    const std::string tmp = checkpoint::prepare(s.root, s.step);
    std::optional<checkpoint::ReadyCommit> ready;
    for (int r = 0; r < world_size(); ++r) {
      checkpoint::ShardReport other = rep;
      other.rank = r;
      const std::string name = checkpoint::shard_file_name(r), f = tmp + "/" + name;
      other.files = {{name, std::filesystem::file_size(f), checkpoint::file_xxh64(f)}};
      ready = one.add("self", other);
    }
    checkpoint::commit(ready->root, ready->manifest, ready->keep);
  }
  grid_barrier();
  return dir;
}

// At most one write in flight: the next save (and the end of training) waits here and
// rethrows what the previous write threw.
std::string Engine::Impl::wait_writer() {
  if (writer.joinable()) writer.join();
  if (writer_error) {
    std::exception_ptr e = writer_error;
    writer_error = nullptr;
    std::rethrow_exception(e);
  }
  return last_committed;
}

std::string Engine::Impl::save(const std::string& root) {
  use_device();
  set_where("checkpoint step " + std::to_string(next_step) + ": waiting for the previous write");
  if (!zpart) {
    wait_writer();
  } else {
    // The snapshot gathers moments over the data group: a previous write that failed on
    // one rank stops every rank here, before the gather, not in it.
    std::exception_ptr failed;
    try {
      wait_writer();
    } catch (...) {
      failed = std::current_exception();
    }
    double flag = failed ? 1.0 : 0.0;
    dp_group->allreduce(&flag, 1, comm::ReduceOp::max, copt);
    if (failed) std::rethrow_exception(failed);
    if (flag > 0.0)
      throw checkpoint::CheckpointError("the previous checkpoint write failed on another data-parallel rank");
  }
  set_where("checkpoint step " + std::to_string(next_step) + ": copying to host memory");
  MaybeSpan snap_span;
  open(snap_span, "checkpoint", [] { return std::string("checkpoint snapshot"); });
  auto snap = std::make_shared<checkpoint::ShardSnapshot>(snapshot(root));
  snap_span.reset();
  const std::string dir = root + "/" + checkpoint::step_dir_name(next_step);
  if (spec.checkpoint.async && (asg.commit_shard || world_size() == 1)) {
    // The write's span (on its own track: it overlaps the steps that follow) is opened here,
    // on the engine thread, so whether it is traced does not race the next step's set_step.
    auto span = std::make_shared<MaybeSpan>();
    open(
        *span, "checkpoint", [] { return std::string("checkpoint write"); }, trace::kCheckpointWriter);
    traced_write.store(span->has_value());
    writer = std::thread([this, snap, span] {
      try {
        last_committed = write_snapshot(*snap);
      } catch (...) {
        writer_error = std::current_exception();
      }
      span->reset();
      traced_write.store(false);
    });
  } else {
    set_where("checkpoint step " + std::to_string(next_step) + ": writing");
    MaybeSpan sp;
    open(sp, "checkpoint", [] { return std::string("checkpoint write"); });
    last_committed = write_snapshot(*snap);
  }
  set_where("idle after the checkpoint of step " + std::to_string(next_step));
  return dir;
}

}  // namespace troupe
