// The plan of one generation of a job: the layout, which layers each pipeline
// stage holds, how the batch splits into micro-batches, and the pipeline
// schedule. It is computed once (make_plan, a pure function of the spec and the
// layout), by the coordinator for a cluster job, shipped to every rank in its
// Assignment, and run by the engine after check_plan has proven it fits the
// model. `troupe status` and the worker logs print the same RankPlace.
//
// Worked example, 4 GPT blocks, dp = pp = tp = 2, global_batch 8, micro_batch 2,
// 1F1B: two model chunks, layers [0,2) with the embedding and [2,4) with the
// head (by cost, partition.hpp); each data replica takes 4 rows, 2 micro-batches
// of 2. Rank 5 = (d 1, p 0, t 1): layers [0,2) + embedding, tensor shard 1 of 2,
// rows 4..7 of every step.
#pragma once

#include <string>
#include <vector>

#include "core/spec.hpp"
#include "plan/grid.hpp"
#include "plan/partition.hpp"
#include "plan/schedule.hpp"

namespace troupe::plan {

// What a plan depends on, taken from the spec.
struct PlanInputs {
  ModelShape model;
  int global_batch = 1;
  int micro_batch = 0;  // 0: one micro-batch of all the replica's rows
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
};
PlanInputs plan_inputs(const JobSpec& spec);
ScheduleKind schedule_kind(troupe::Schedule s);

struct Plan {
  Layout layout;
  int local_rows = 1;   // rows of the global batch each data replica takes
  int micro_batch = 1;  // rows per forward/backward
  int n_micro = 1;      // micro-batches per step on each rank
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
  Partition partition;  // model chunk k = c * pp + p
  // With a pipeline (pp > 1): the schedule table and what check_schedule proved of it;
  // empty without one.
  Schedule table;
  CheckResult check;

  // Activation slots local chunk c of pipeline rank p needs (at least 1).
  int slots(int p, int c) const;

  // The boundaries of the model chunks: chunk k holds blocks [b[k], b[k+1]).
  std::vector<int> boundaries() const;
  // "layout 2x2x2, 2 micro-batches of 2 rows, 1f1b, chunks [0,2) [2,4)"
  std::string str() const;
};

// Plans a job on a layout; throws troupe::Error naming the fix when the layout
// does not fit the batch or the model (rows not divisible, fewer layers than
// stages) or the schedule cannot run (ScheduleError).
Plan make_plan(const PlanInputs& in, const Layout& layout);
// The checks of make_plan that need neither the partition nor the schedule simulation
// (divisibility, enough layers, the interleaved schedule's grouping): cheap enough for a
// coordinator to ask of every candidate layout. make_plan runs them first.
void check_fits(const PlanInputs& in, const Layout& layout);
// A plan with given chunk boundaries (a shipped plan, or a planner's choice):
// the same checks as make_plan, plus that the boundaries cover every layer in
// pp * virtual_stages non-empty runs.
Plan make_plan(const PlanInputs& in, const Layout& layout, int micro_batch,
               const std::vector<int>& boundaries);

// Where one rank sits and what it runs.
struct RankPlace {
  int rank = 0;
  Coord coord;
  std::vector<LayerRange> chunks;  // local chunk c = model chunk c * pp + p
  int first_row = 0;               // first row of the global batch this replica takes
  // "rank 5: dp 1 pp 0 tp 1, layers [0,2)+embedding" — the line `troupe status` and
  // the worker log share.
  std::string str() const;
};
RankPlace rank_place(const Plan& plan, int rank);
// "[0,2)+embedding [2,4)+head" for a rank's chunks.
std::string layers_str(const std::vector<LayerRange>& chunks);

}  // namespace troupe::plan
