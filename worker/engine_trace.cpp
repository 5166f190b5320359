// train.trace glue: the clock offset of each rank to rank 0's, measured at connect, and the
// rank's trace file (rank<r>.json), written once its traced steps are done. The spans
// themselves are opened where the work is (Impl::open, engine_impl.hpp).
#include <exception>
#include <iostream>
#include <string>

#include "worker/engine_impl.hpp"

namespace troupe {

namespace {

// Tags of the clock-offset exchange at connect (tracing only), below the evaluation's
// (engine_eval.cpp).
constexpr uint32_t kClockTagBase = 1u << 29;

}  // namespace

// NTP-style against rank 0 over the world communicator: rank 0 stamps t0, rank r answers
// with its own clock t1, rank 0 stamps t2 on the answer and sends back (t0 + t2) / 2 - t1.
// Every rank of a traced job calls it: the spec, the same on all, decides.
void Engine::Impl::measure_clock_offset() {
  set_where("measuring clock offsets for the trace");
  if (asg.rank == 0) {
    for (int r = 1; r < world_size(); ++r) {
      const int64_t t0 = tracer.now_us();
      int64_t t1 = 0;
      world->send(&t0, sizeof t0, r, kClockTagBase, copt);
      world->recv(&t1, sizeof t1, r, kClockTagBase + 1, copt);
      const int64_t t2 = tracer.now_us();
      const int64_t off = (t0 + t2) / 2 - t1;
      world->send(&off, sizeof off, r, kClockTagBase + 2, copt);
    }
    return;
  }
  int64_t t0 = 0;
  world->recv(&t0, sizeof t0, 0, kClockTagBase, copt);
  const int64_t t1 = tracer.now_us();
  world->send(&t1, sizeof t1, 0, kClockTagBase + 1, copt);
  world->recv(&clock_offset_us, sizeof clock_offset_us, 0, kClockTagBase + 2, copt);
}

// The trace file of this rank, once the traced steps and the checkpoint after the last of
// them are done: at the next step, or when the engine ends. A trace that cannot be written
// is reported and dropped; it never stops the job.
void Engine::Impl::write_trace() noexcept {
  if (trace_written || tracer.steps() == 0 || asg.trace_dir.empty()) return;
  trace_written = true;
  try {
    write_trace_file();
  } catch (const std::exception& e) {
    std::cerr << "troupe: rank " << asg.rank << ": the trace was not written: " << e.what() << std::endl;
  }
}

void Engine::Impl::write_trace_file() {
  trace::RankInfo info;
  info.rank = asg.rank;
  info.world = world_size();
  info.layout = layout().str();
  info.place = where_in_plan.str();
  info.clock_offset_us = clock_offset_us;
  info.from_step = spec.train.trace.from_step;
  info.steps = spec.train.trace.steps;
  trace::write_rank_trace(asg.trace_dir + "/rank" + std::to_string(asg.rank) + ".json", info, tracer.take());
}

}  // namespace troupe
