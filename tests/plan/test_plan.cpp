// The rank grid and the plan: one answer to "which rank runs what", for the
// coordinator, the engine and `troupe status` alike.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "plan/plan.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

PlanInputs gpt(int layers, int global_batch, int micro_batch, ScheduleKind kind = ScheduleKind::one_f_one_b,
               int v = 1) {
  PlanInputs in;
  in.model = {ModelType::gpt, layers, 64, 256, 32};
  in.global_batch = global_batch;
  in.micro_batch = micro_batch;
  in.schedule = kind;
  in.virtual_stages = v;
  return in;
}

}  // namespace

TEST_CASE("grid: rank = (d * pp + p) * tp + t, and back", "[plan][grid]") {
  const Layout l{2, 2, 2};
  CHECK(l.str() == "2x2x2");
  CHECK(l.world() == 8);
  // The worked example of plan/grid.hpp.
  const int d[] = {0, 0, 0, 0, 1, 1, 1, 1}, p[] = {0, 0, 1, 1, 0, 0, 1, 1}, t[] = {0, 1, 0, 1, 0, 1, 0, 1};
  for (int r = 0; r < 8; ++r) {
    const Coord c = coord_of(l, r);
    CHECK(c == Coord{d[r], p[r], t[r]});
    CHECK(rank_of(l, c) == r);
  }
  for (int dp = 1; dp <= 3; ++dp)
    for (int pp = 1; pp <= 3; ++pp)
      for (int tp = 1; tp <= 3; ++tp) {
        const Layout x{dp, pp, tp};
        for (int r = 0; r < x.world(); ++r) CHECK(rank_of(x, coord_of(x, r)) == r);
      }
  CHECK_THROWS_WITH(coord_of(l, 8), Catch::Contains("rank 8 is outside layout 2x2x2"));
  CHECK_THROWS_WITH(rank_of(l, {0, 2, 0}), Catch::Contains("outside layout 2x2x2"));
  CHECK_THROWS_WITH(coord_of({0, 1, 1}, 0), Catch::Contains("must be >= 1"));
}

TEST_CASE("plan: 2x2x2 places every rank on its stage's layers", "[plan]") {
  const Plan pl = make_plan(gpt(4, 8, 2), {2, 2, 2});
  CHECK(pl.local_rows == 4);
  CHECK(pl.micro_batch == 2);
  CHECK(pl.n_micro == 2);
  CHECK(pl.partition.n_chunks() == 2);
  CHECK(pl.boundaries().front() == 0);
  CHECK(pl.boundaries().back() == 4);
  // Rank 5 = (d 1, p 0, t 1): the first stage of the second replica.
  const RankPlace r5 = rank_place(pl, 5);
  CHECK(r5.coord == Coord{1, 0, 1});
  CHECK(r5.first_row == 4);
  REQUIRE(r5.chunks.size() == 1);
  CHECK(r5.chunks[0] == pl.partition.of(0, 0));
  CHECK(r5.chunks[0].has_embedding);
  CHECK(r5.str() == "rank 5: dp 1 pp 0 tp 1, layers " + layers_str({pl.partition.of(0, 0)}));
  for (int r = 0; r < 8; ++r) {
    const RankPlace x = rank_place(pl, r);
    CHECK(x.chunks[0] == pl.partition.of(x.coord.p, 0));
  }
  // The checked schedule gives every chunk its activation slots.
  CHECK(pl.slots(0, 0) == 2);  // 1F1B: rank 0 holds min(pp - p, m) = 2 in flight
  CHECK(pl.slots(1, 0) == 1);
}

TEST_CASE("plan: interleaved chunks alternate between pipeline ranks", "[plan]") {
  const Plan pl = make_plan(gpt(8, 8, 1, ScheduleKind::interleaved, 2), {1, 2, 1});
  CHECK(pl.virtual_stages == 2);
  CHECK(pl.partition.n_chunks() == 4);
  const RankPlace r1 = rank_place(pl, 1);
  REQUIRE(r1.chunks.size() == 2);
  CHECK(r1.chunks[0] == pl.partition.chunks[1]);
  CHECK(r1.chunks[1] == pl.partition.chunks[3]);
  CHECK(r1.chunks[1].has_head);
}

TEST_CASE("plan: one stage has no schedule and one chunk", "[plan]") {
  const Plan pl = make_plan(gpt(3, 6, 0), {3, 1, 1});
  CHECK(pl.micro_batch == 2);  // 0: all of the replica's rows
  CHECK(pl.n_micro == 1);
  CHECK(pl.partition.chunks == std::vector<LayerRange>{{0, 3, true, true}});
  CHECK(pl.slots(0, 0) == 1);
  CHECK(pl.table.ranks.empty());
}

TEST_CASE("plan: a layout that does not fit is refused naming the fix", "[plan]") {
  CHECK_THROWS_WITH(make_plan(gpt(4, 6, 1), {4, 1, 1}), Catch::Contains("not divisible by data 4"));
  CHECK_THROWS_WITH(make_plan(gpt(4, 8, 3), {2, 1, 1}), Catch::Contains("not a multiple of micro_batch 3"));
  CHECK_THROWS_WITH(make_plan(gpt(2, 8, 1), {1, 4, 1}), Catch::Contains("cannot give each"));
  CHECK_THROWS_WITH(make_plan(gpt(8, 6, 1, ScheduleKind::interleaved, 2), {1, 4, 1}),
                    Catch::Contains("groups of pipeline = 4: 6 micro-batches"));
  // check_fits refuses the same without partitioning or simulating anything.
  CHECK_THROWS_WITH(check_fits(gpt(8, 6, 1, ScheduleKind::interleaved, 2), {1, 4, 1}),
                    Catch::Contains("groups of pipeline = 4"));
  CHECK_THROWS_WITH(check_fits(gpt(2, 8, 1), {1, 4, 1}), Catch::Contains("cannot give each of 4"));
  CHECK_NOTHROW(check_fits(gpt(8, 8, 1, ScheduleKind::interleaved, 2), {1, 4, 1}));
  // A layout too large for int rank arithmetic is refused, not overflowed.
  CHECK_THROWS_WITH(check_layout({1 << 12, 1, 1 << 20}), Catch::Contains("more than"));
  CHECK_THROWS_WITH(make_plan(gpt(4, 8, 1), {1, 1431655765, 1}, 1, {}), Catch::Contains("more than"));
}

TEST_CASE("plan: given boundaries are checked and rebuild the same plan", "[plan]") {
  const PlanInputs in = gpt(6, 8, 2);
  const Plan pl = make_plan(in, {1, 3, 1});
  const Plan again = make_plan(in, {1, 3, 1}, pl.micro_batch, pl.boundaries());
  CHECK(again.partition.chunks == pl.partition.chunks);
  CHECK(again.partition.cost == pl.partition.cost);
  CHECK(again.n_micro == pl.n_micro);
  CHECK(again.check.peak_in_flight == pl.check.peak_in_flight);
  // A planner may choose other boundaries; they must still cover the model.
  CHECK(make_plan(in, {1, 3, 1}, 2, {0, 1, 2, 6}).partition.of(2, 0).n_blocks() == 4);
  CHECK_THROWS_WITH(make_plan(in, {1, 3, 1}, 2, {0, 2, 6}), Catch::Contains("3 chunk boundaries for 3"));
  CHECK_THROWS_WITH(make_plan(in, {1, 3, 1}, 2, {}), Catch::Contains("0 chunk boundaries for 3"));
  CHECK_THROWS_WITH(make_plan(in, {1, 3, 1}, 2, {0, 2, 2, 6}), Catch::Contains("holds no layer"));
  CHECK_THROWS_WITH(make_plan(in, {1, 3, 1}, 2, {0, 2, 4, 5}), Catch::Contains("do not cover the model's 6"));
}
