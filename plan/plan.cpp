#include "plan/plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace troupe::plan {

ScheduleKind schedule_kind(troupe::Schedule s) {
  switch (s) {
    case troupe::Schedule::gpipe:
      return ScheduleKind::gpipe;
    case troupe::Schedule::interleaved:
      return ScheduleKind::interleaved;
    case troupe::Schedule::zb_h1:
      return ScheduleKind::zb_h1;
    case troupe::Schedule::one_f_one_b:
      break;
  }
  return ScheduleKind::one_f_one_b;
}

PlanInputs plan_inputs(const JobSpec& spec) {
  PlanInputs in;
  in.model = model_shape(spec);
  in.global_batch = spec.train.global_batch;
  in.micro_batch = spec.train.micro_batch;
  in.schedule = schedule_kind(spec.parallel.schedule);
  in.virtual_stages = spec.parallel.virtual_stages;
  return in;
}

std::vector<int> Plan::boundaries() const {
  std::vector<int> b;
  for (const auto& c : partition.chunks) b.push_back(c.first);
  b.push_back(partition.chunks.empty() ? 0 : partition.chunks.back().last);
  return b;
}

int Plan::slots(int p, int c) const { return activation_slots(check, layout.pp, p, c); }

std::string layers_str(const std::vector<LayerRange>& chunks) {
  std::string s;
  for (const auto& c : chunks) {
    if (!s.empty()) s += " ";
    s += "[" + std::to_string(c.first) + "," + std::to_string(c.last) + ")";
    if (c.has_embedding) s += "+embedding";
    if (c.has_head) s += "+head";
  }
  return s;
}

std::string Plan::str() const {
  return "layout " + layout.str() + ", " + std::to_string(n_micro) + " micro-batch" +
         (n_micro == 1 ? "" : "es") + " of " + std::to_string(micro_batch) + " rows, " +
         schedule_name(schedule) +
         (virtual_stages > 1 ? " x" + std::to_string(virtual_stages) + " virtual" : "") + ", chunks " +
         layers_str(partition.chunks);
}

namespace {

// Everything but the partition; then fills the slots from the checked schedule.
Plan base_plan(const PlanInputs& in, const Layout& layout) {
  check_layout(layout);
  Plan p;
  p.layout = layout;
  require(in.global_batch >= 1, "train.global_batch must be >= 1");
  require(in.global_batch % layout.dp == 0, "global_batch ", in.global_batch, " is not divisible by data ",
          layout.dp, ": use a global_batch that is a multiple of the data degree");
  p.local_rows = in.global_batch / layout.dp;
  p.micro_batch = in.micro_batch > 0 ? in.micro_batch : p.local_rows;
  require(p.local_rows % p.micro_batch == 0, "global_batch / data = ", p.local_rows,
          " is not a multiple of micro_batch ", p.micro_batch);
  p.n_micro = p.local_rows / p.micro_batch;
  // A pipeline of one stage has no schedule: its one chunk runs the micro-batches in turn.
  p.schedule = layout.pp > 1 ? in.schedule : ScheduleKind::one_f_one_b;
  p.virtual_stages = layout.pp > 1 && in.schedule == ScheduleKind::interleaved ? in.virtual_stages : 1;
  // What the partition and the schedule would refuse, checked without running them.
  const int64_t chunks = int64_t(layout.pp) * p.virtual_stages;
  require(p.virtual_stages >= 1 && chunks <= in.model.n_layers, "a model of ", in.model.n_layers,
          " layers cannot give each of ", chunks, " pipeline stages (pipeline ", layout.pp, " x virtual ",
          p.virtual_stages, ") a block: use fewer stages or more layers");
  if (p.schedule == ScheduleKind::interleaved)
    require(p.virtual_stages >= 2 && p.n_micro % layout.pp == 0,
            "the interleaved schedule runs micro-batches in ", "groups of pipeline = ", layout.pp, ": ",
            p.n_micro, " micro-batches per step do not divide; ",
            "choose global_batch / (data x micro_batch) as a multiple of ", layout.pp);
  return p;
}

// The schedule is checked here, once: the executor runs the proven table.
void fill_schedule(Plan& p) {
  if (p.layout.pp == 1) return;
  p.table = make_schedule(p.schedule, p.layout.pp, p.virtual_stages, p.n_micro);
  p.check = check_schedule(p.table);
}

}  // namespace

void check_fits(const PlanInputs& in, const Layout& layout) { base_plan(in, layout); }

Plan make_plan(const PlanInputs& in, const Layout& layout) {
  Plan p = base_plan(in, layout);
  p.partition = partition_layers(layout.pp, p.virtual_stages, in.model);
  fill_schedule(p);
  return p;
}

Plan make_plan(const PlanInputs& in, const Layout& layout, int micro_batch, const std::vector<int>& b) {
  PlanInputs fixed = in;
  fixed.micro_batch = micro_batch;
  Plan p = base_plan(fixed, layout);
  const int S = layout.pp * p.virtual_stages, L = in.model.n_layers;  // base_plan: S <= L
  require(!b.empty() && int64_t(b.size()) == S + 1, "plan: ", b.size(), " chunk boundaries for ", S,
          " model chunks (pipeline ", layout.pp, " x virtual ", p.virtual_stages, "); want ", S + 1);
  require(b.front() == 0 && b.back() == L, "plan: chunk boundaries [", b.front(), ", ", b.back(),
          "] do not cover the model's ", L, " layers");
  const StageCosts costs = stage_costs(in.model);
  p.partition.pp = layout.pp;
  p.partition.virtual_stages = p.virtual_stages;
  for (int k = 0; k < S; ++k) {
    require(b[size_t(k + 1)] > b[size_t(k)], "plan: model chunk ", k, " holds no layer (boundaries ",
            b[size_t(k)], ", ", b[size_t(k + 1)], ")");
    p.partition.chunks.push_back({b[size_t(k)], b[size_t(k + 1)], k == 0, k == S - 1});
    p.partition.cost.push_back((b[size_t(k + 1)] - b[size_t(k)]) * costs.block +
                               (k == 0 ? costs.embedding : 0.0) + (k == S - 1 ? costs.head : 0.0));
  }
  fill_schedule(p);
  return p;
}

RankPlace rank_place(const Plan& plan, int rank) {
  RankPlace r;
  r.rank = rank;
  r.coord = coord_of(plan.layout, rank);
  for (int c = 0; c < plan.virtual_stages; ++c) r.chunks.push_back(plan.partition.of(r.coord.p, c));
  r.first_row = r.coord.d * plan.local_rows;
  return r;
}

std::string RankPlace::str() const {
  return "rank " + std::to_string(rank) + ": dp " + std::to_string(coord.d) + " pp " +
         std::to_string(coord.p) + " tp " + std::to_string(coord.t) + ", layers " + layers_str(chunks);
}

}  // namespace troupe::plan
