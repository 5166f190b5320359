// The pipeline schedules as tables: per pipeline rank, the list of F/B/W ops of one step
// (GPipe, 1F1B, interleaved 1F1B, ZB-H1), their names and the bubble theory gives them. The
// communication each table implies is derived in schedule_program.cpp and checked in
// schedule_check.cpp.
#include "plan/schedule.hpp"

#include <algorithm>

namespace troupe::plan {

std::string to_string(const Op& op) {
  const char* pass = op.pass == Pass::F ? "F" : op.pass == Pass::B ? "B" : "W";
  std::string s = pass + std::to_string(op.mb);
  if (op.chunk != 0) s += "." + std::to_string(op.chunk);
  if (op.fused) s += "+";
  return s;
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
  }
  return "?";
}

ScheduleKind schedule_from_name(const std::string& s) {
  for (ScheduleKind k :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1})
    if (s == schedule_name(k)) return k;
  TROUPE_CHECK(false, "unknown pipeline schedule '", s, "' (gpipe, 1f1b, interleaved, zb-h1)");
  return ScheduleKind::gpipe;
}

int micro_batches(int64_t global_batch, int data, int micro_batch) {
  TROUPE_CHECK(data >= 1 && micro_batch >= 1 && global_batch >= 1, "global batch ", global_batch, ", data ",
               data, ", micro-batch ", micro_batch, " must all be >= 1");
  const int64_t per_step = static_cast<int64_t>(data) * micro_batch;
  TROUPE_CHECK(global_batch % per_step == 0, "global batch ", global_batch, " is not a multiple of data (",
               data, ") x micro-batch (", micro_batch, ") = ", per_step);
  return static_cast<int>(global_batch / per_step);
}

static void check_sizes(int pp, int v, int m) {
  TROUPE_CHECK(pp >= 1 && v >= 1 && m >= 1, "pipeline ", pp, ", virtual stages ", v, ", micro-batches ", m,
               " must all be >= 1");
}

Schedule gpipe(int pp, int m) {
  check_sizes(pp, 1, m);
  Schedule s{ScheduleKind::gpipe, pp, 1, m, std::vector<std::vector<Op>>(pp)};
  for (int p = 0; p < pp; ++p) {
    for (int i = 0; i < m; ++i) s.ranks[p].push_back({Pass::F, i, 0});
    for (int i = 0; i < m; ++i) s.ranks[p].push_back({Pass::B, i, 0});
  }
  return s;
}

Schedule one_f_one_b(int pp, int m) {
  check_sizes(pp, 1, m);
  Schedule s{ScheduleKind::one_f_one_b, pp, 1, m, std::vector<std::vector<Op>>(pp)};
  for (int p = 0; p < pp; ++p) {
    auto& ops = s.ranks[p];
    // Enough forwards in flight that the last stage's first backward reaches us
    // exactly when we need it.
    const int warmup = std::min(pp - p - 1, m);
    const int steady = m - warmup;
    // warm-up forwards
    for (int i = 0; i < warmup; ++i) ops.push_back({Pass::F, i, 0});
    // steady 1F1B: each forward frees an older micro-batch with its backward
    for (int i = 0; i < steady; ++i) {
      ops.push_back({Pass::F, warmup + i, 0});
      ops.push_back({Pass::B, i, 0});
    }
    // cool-down backwards
    for (int i = steady; i < m; ++i) ops.push_back({Pass::B, i, 0});
  }
  return s;
}

Schedule interleaved_1f1b(int pp, int v, int m) {
  check_sizes(pp, v, m);
  TROUPE_CHECK(pp >= 2, "the interleaved schedule needs pipeline >= 2 (got ", pp,
               "): with one rank use 1f1b on the whole model");
  TROUPE_CHECK(v >= 2, "the interleaved schedule needs virtual stages >= 2 (got ", v, "): use 1f1b");
  TROUPE_CHECK(m % pp == 0, "the interleaved schedule runs micro-batches in groups of pipeline (", pp,
               ") per chunk: micro-batches ", m, " must be a multiple of ", pp);
  Schedule s{ScheduleKind::interleaved, pp, v, m, std::vector<std::vector<Op>>(pp)};
  const int total = m * v;  // ops of each pass on every rank
  const int group = pp * v;
  // The k-th forward (backward) of a rank: micro-batches go through chunk 0 in
  // groups of pp, then the same group through chunk 1, ...; backwards walk the
  // chunks in reverse.
  auto op_at = [&](Pass pass, int k) {
    const int in_group = k % group;
    int chunk = in_group / pp;
    if (pass == Pass::B) chunk = v - 1 - chunk;
    return Op{pass, (k / group) * pp + k % pp, chunk};
  };
  for (int p = 0; p < pp; ++p) {
    auto& ops = s.ranks[p];
    // Megatron: with m == pp every forward comes first; otherwise enough
    // forwards for the first backward of the last chunk to come back.
    const int warmup = m == pp ? total : std::min(total, (pp - p - 1) * 2 + (v - 1) * pp);
    const int steady = total - warmup;
    // warm-up forwards
    for (int k = 0; k < warmup; ++k) ops.push_back(op_at(Pass::F, k));
    // steady 1F1B
    // steady 1F1B: F and B between the same two batches (Megatron's
    // send_forward_backward_recv_forward_backward); per-op batches would let two
    // neighbours each wait on the other's send.
    for (int k = 0; k < steady; ++k) {
      Op f = op_at(Pass::F, warmup + k);
      f.fused = true;
      ops.push_back(f);
      ops.push_back(op_at(Pass::B, k));
    }
    // cool-down backwards
    for (int k = steady; k < total; ++k) ops.push_back(op_at(Pass::B, k));
  }
  return s;
}

Schedule zb_h1(int pp, int m) {
  check_sizes(pp, 1, m);
  Schedule s{ScheduleKind::zb_h1, pp, 1, m, std::vector<std::vector<Op>>(pp)};
  for (int p = 0; p < pp; ++p) {
    auto& ops = s.ranks[p];
    // 1F1B's warm-up and F/B order, so the F/B communication pairs as 1F1B's.
    const int warmup = std::min(pp - p - 1, m);
    const int steady = m - warmup;
    // W of micro-batch k - p after the B of k: rank p then holds
    // (pp - p) + p = pp micro-batches, what rank 0 holds in 1F1B, and keeps p
    // W's back for the cool-down, where it would otherwise wait for the
    // gradients coming down the pipeline.
    int next_w = 0;
    auto weights_after_b = [&](int k) {
      if (k - p >= 0) ops.push_back({Pass::W, next_w++, 0});
    };
    // warm-up forwards
    for (int i = 0; i < warmup; ++i) ops.push_back({Pass::F, i, 0});
    // steady: F, B, and a delayed W
    for (int i = 0; i < steady; ++i) {
      ops.push_back({Pass::F, warmup + i, 0});
      ops.push_back({Pass::B, i, 0});
      weights_after_b(i);
    }
    // cool-down backwards, each with a delayed W
    for (int i = steady; i < m; ++i) {
      ops.push_back({Pass::B, i, 0});
      weights_after_b(i);
    }
    // the W's still held back, in micro-batch order
    while (next_w < m) ops.push_back({Pass::W, next_w++, 0});
  }
  return s;
}

Schedule make_schedule(ScheduleKind kind, int pp, int v, int m) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return gpipe(pp, m);
    case ScheduleKind::one_f_one_b:
      return one_f_one_b(pp, m);
    case ScheduleKind::interleaved:
      return interleaved_1f1b(pp, v, m);
    case ScheduleKind::zb_h1:
      TROUPE_CHECK(v == 1, "the zb-h1 schedule has one chunk per rank (got virtual stages ", v,
                   "): use virtual stages 1, or the interleaved schedule");
      return zb_h1(pp, m);
  }
  TROUPE_CHECK(false, "unknown schedule kind");
  return {};
}

double theoretical_bubble(ScheduleKind kind, int pp, int v, int m) {
  // zb-h1, F = B = W = 1: each rank idles p - 1 units of m * 3 busy ones.
  if (kind == ScheduleKind::zb_h1) return (pp - 1.0) / (3.0 * m + pp - 1.0);
  const double p = pp, mm = m, vv = kind == ScheduleKind::interleaved ? v : 1;
  return (p - 1) / (vv * mm + p - 1);
}

}  // namespace troupe::plan
