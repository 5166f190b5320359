// `troupe plan --calibrate`'s measurements (cli/calibrate.cpp says what each one is and how):
// the compute figures, timed in worker processes side by side (calibrate_compute.cpp), and
// the collectives between two gloo worker processes (calibrate_comm.cpp). Internal to the
// calibration.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "core/spec.hpp"
#include "plan/hardware.hpp"

namespace troupe::cli::calibrate_detail {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- compute (calibrate_compute.cpp)

struct Shape {
  int64_t m, n, k;
  plan::GemmOp op;
  DType dt;
  bool operator<(const Shape& o) const {
    return std::tie(m, n, k, op, dt) < std::tie(o.m, o.n, o.k, o.op, o.dt);
  }
};

// The products a plan of `spec` on up to `devices` devices would run.
std::vector<Shape> spec_shapes(const JobSpec& spec, int devices);
std::vector<Shape> grid_shapes();  // a generic grid, when no spec is given

struct ComputeFigures {
  std::vector<double> gemm_rate;  // by shape
  double peak_f32 = 0, peak_bf16 = 0, peak_f16 = 0, small_f32 = 0;
  // Bytes per second as the cost model counts them: AdamW over buffers larger than the caches
  // (the memory's bandwidth), and at the spec's activation sizes a residual add, a LayerNorm
  // forward + backward, a GELU forward + backward.
  double stream_bw = 0, elementwise_bw = 0, norm_bw = 0, activation_bw = 0;
  double attention_flops = 0;  // the causal attention core, forward + backward
  // The scalar figures in one order, for the pipe from a measuring process.
  std::vector<double*> scalars() {
    return {&peak_f32,       &peak_bf16, &peak_f16,      &small_f32,      &stream_bw,
            &elementwise_bw, &norm_bw,   &activation_bw, &attention_flops};
  }
};

// Runs measure_compute in n processes at once; returns each one's figures.
std::vector<ComputeFigures> measure_compute_parallel(const std::vector<Shape>& shapes,
                                                     const std::vector<JobSpec>& specs, int n);

// ---------------------------------------------------------------- comm (calibrate_comm.cpp)

struct Sample {
  double bytes, seconds;
};

// (latency, bandwidth) of time = steps * latency + factor * bytes / bandwidth, by least squares
// on the relative error (each size counts alike, the small ones that fix the latency too).
plan::LinkCost fit(const std::vector<Sample>& s, double steps, double factor);

// Rank 0's samples of each collective between two gloo worker processes on this host.
struct CommFigures {
  std::vector<Sample> p2p, allreduce, allgather, reduce_scatter;
  double rss_bytes = 0;  // a worker's resident memory with its communicator, before any model
};

// Runs two gloo worker processes on this host and returns rank 0's samples.
CommFigures measure_comm();

}  // namespace troupe::cli::calibrate_detail
