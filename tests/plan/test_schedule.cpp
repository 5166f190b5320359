#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "plan/schedule.hpp"
#include "tests/plan/schedule_util.hpp"

using namespace troupe;
using namespace troupe::plan;

TEST_CASE("schedule: micro-batches per step", "[parallel][schedule]") {
  REQUIRE(micro_batches(32, 2, 4) == 4);
  REQUIRE(micro_batches(8, 1, 1) == 8);
  REQUIRE_THROWS_WITH(micro_batches(30, 2, 4),
                      Catch::Contains("not a multiple of data (2) x micro-batch (4)"));
  REQUIRE_THROWS_AS(micro_batches(8, 0, 1), Error);
}

TEST_CASE("schedule: 1F1B reads as warm-up, steady and cool-down", "[parallel][schedule]") {
  Schedule s = one_f_one_b(4, 6);
  // rank 0: 3 warm-up forwards, 3 steady pairs, 3 cool-down backwards
  REQUIRE(table_text(s) ==
          "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5\n"
          "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5\n"
          "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5\n"
          "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5\n");
  // fewer micro-batches than stages: warm-up is capped at m
  REQUIRE(table_text(one_f_one_b(4, 2)) ==
          "rank 0: F0 F1 B0 B1\nrank 1: F0 F1 B0 B1\nrank 2: F0 F1 B0 B1\nrank 3: F0 B0 F1 B1\n");
  REQUIRE(table_text(gpipe(2, 3)) == "rank 0: F0 F1 F2 B0 B1 B2\nrank 1: F0 F1 F2 B0 B1 B2\n");
}

TEST_CASE("schedule: interleaved follows Megatron's chunk order and rejects invalid sizes",
          "[parallel][schedule]") {
  Schedule s = interleaved_1f1b(2, 2, 4);
  // Micro-batches enter chunk 0 in groups of pp = 2, then the same group goes through chunk 1.
  // rank 0 warm-up = (2-0-1)*2 + (2-1)*2 = 4 forwards.
  REQUIRE(table_text(s) ==
          "rank 0: F0 F1 F0.1 F1.1 F2+ B0.1 F3+ B1.1 F2.1+ B0 F3.1+ B1 B2.1 B3.1 B2 B3\n"
          "rank 1: F0 F1 F0.1+ B0.1 F1.1+ B1.1 F2+ B0 F3+ B1 F2.1+ B2.1 F3.1+ B3.1 B2 B3\n");
  // The steady state's F and B share their batches; one batch per op deadlocks here.
  Schedule unfused = s;
  for (auto& ops : unfused.ranks)
    for (auto& op : ops) op.fused = false;
  REQUIRE_THROWS_WITH(check_schedule(unfused), Catch::Contains("deadlock: crossed order"));
  REQUIRE_THROWS_WITH(interleaved_1f1b(2, 2, 3), Catch::Contains("must be a multiple of 2"));
  REQUIRE_THROWS_WITH(interleaved_1f1b(1, 2, 4), Catch::Contains("needs pipeline >= 2"));
  REQUIRE_THROWS_WITH(interleaved_1f1b(2, 1, 4), Catch::Contains("virtual stages >= 2"));
  REQUIRE_THROWS_AS(make_schedule(ScheduleKind::one_f_one_b, 0, 1, 4), Error);
  REQUIRE(schedule_from_name("interleaved") == ScheduleKind::interleaved);
  REQUIRE_THROWS_WITH(schedule_from_name("zb"), Catch::Contains("gpipe, 1f1b, interleaved"));
}

TEST_CASE("schedule: every generated table is proven deadlock-free, pp 1-8, m 1-32", "[parallel][schedule]") {
  int checked = 0;
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 32; ++m) {
      for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        Schedule s = make_schedule(kind, pp, 1, m);
        INFO(schedule_name(kind) << " pp " << pp << " m " << m);
        CheckResult r = check_schedule(s);
        // eager sends (the local and buffered backends) can only be easier
        check_schedule(s, CheckOptions{Pairing::paired, false});
        for (int p = 0; p < pp; ++p)
          REQUIRE(r.peak_in_flight[p][0] == (kind == ScheduleKind::gpipe ? m : std::min(pp - p, m)));
        // Equal stages, free communication: the textbook bubble, exactly.
        REQUIRE(r.bubble == Approx(theoretical_bubble(kind, pp, 1, m)).margin(1e-12));
        REQUIRE(r.makespan == Approx(3.0 * (m + pp - 1)));
        ++checked;
      }
      for (int v = 2; v <= 4 && pp >= 2; ++v) {
        if (m % pp) {
          REQUIRE_THROWS_AS(interleaved_1f1b(pp, v, m), Error);
          continue;
        }
        Schedule s = interleaved_1f1b(pp, v, m);
        INFO("interleaved pp " << pp << " v " << v << " m " << m);
        CheckResult r = check_schedule(s);
        check_schedule(s, CheckOptions{Pairing::paired, false});
        // Interleaving trades memory for a bubble that shrinks with v.
        if (m > pp) REQUIRE(r.bubble < theoretical_bubble(ScheduleKind::one_f_one_b, pp, 1, m));
        REQUIRE(r.bubble == Approx(theoretical_bubble(ScheduleKind::interleaved, pp, v, m)).margin(1e-9));
        REQUIRE(r.peak_per_rank[0] <= m * v);
        ++checked;
      }
    }
  REQUIRE(checked > 500);
}

TEST_CASE("schedule: naive blocking send/recv of 1F1B deadlocks, the paired batches do not",
          "[parallel][schedule]") {
  Schedule s = one_f_one_b(2, 2);
  std::string e = error_of(s, CheckOptions{Pairing::unpaired, true});
  INFO(e);
  // rank 0 sends F1's activations while rank 1 sends B0's gradient: each waits on the other.
  REQUIRE_THAT(e, Catch::Contains("crossed order, wait cycle rank 0 -> rank 1 -> rank 0"));
  REQUIRE_THAT(e, Catch::Contains("rank 0 sends activations of micro-batch 1 to rank 1"));
  REQUIRE_THAT(e, Catch::Contains("rank 1 sends gradient of micro-batch 0 to rank 0"));
  REQUIRE(error_of(s).empty());
  // GPipe needs no pairing: every rank does all forwards first.
  REQUIRE(error_of(gpipe(4, 4), CheckOptions{Pairing::unpaired, true}).empty());
}

TEST_CASE("schedule: hand-made broken tables are rejected with a clear message", "[parallel][schedule]") {
  SECTION("a missing receive") {
    Schedule s = one_f_one_b(2, 2);
    s.ranks[1] = {{Pass::F, 0, 0}, {Pass::B, 0, 0}};  // rank 1 forgot micro-batch 1
    REQUIRE_THAT(error_of(s), Catch::Contains("missing receive: rank 0 sends activations of micro-batch 1 to "
                                              "rank 1") &&
                                  Catch::Contains("rank 1 never receives them"));
  }
  SECTION("a missing send") {
    Schedule s = gpipe(3, 2);
    s.ranks[0] = {{Pass::F, 0, 0}, {Pass::B, 0, 0}};
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 never sends them"));
  }
  SECTION("a crossed order") {
    Schedule s = gpipe(2, 2);
    // rank 1 runs micro-batch 1 before 0: each rank waits for what the other sends later
    s.ranks[1] = {{Pass::F, 1, 0}, {Pass::B, 1, 0}, {Pass::F, 0, 0}, {Pass::B, 0, 0}};
    s.ranks[0] = {{Pass::F, 0, 0}, {Pass::B, 0, 0}, {Pass::F, 1, 0}, {Pass::B, 1, 0}};
    std::string e = error_of(s);
    INFO(e);
    REQUIRE_THAT(e, Catch::Contains("deadlock: crossed order"));
    REQUIRE_THAT(e, Catch::Contains("rank 1 receives activations of micro-batch 1 from rank 0"));
  }
  SECTION("a duplicate F") {
    Schedule s = one_f_one_b(2, 3);
    s.ranks[0].insert(s.ranks[0].begin() + 1, Op{Pass::F, 0, 0});
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #1 (F0): duplicate F"));
  }
  SECTION("B before F") {
    Schedule s = gpipe(1, 2);
    s.ranks[0] = {{Pass::B, 1, 0}, {Pass::F, 0, 0}, {Pass::F, 1, 0}, {Pass::B, 0, 0}};
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #0 (B1): B before its F"));
  }
  SECTION("a missing B on a single stage") {
    Schedule s = gpipe(1, 2);
    s.ranks[0].pop_back();
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 chunk 0: micro-batch 1 has no B"));
  }
  SECTION("an op out of range") {
    Schedule s = gpipe(2, 2);
    s.ranks[1][0].chunk = 1;
    REQUIRE_THAT(error_of(s), Catch::Contains("chunk in [0, 1)"));
  }
  SECTION("more live micro-batches than slots") {
    Schedule s = gpipe(2, 4);
    REQUIRE_THAT(error_of(s, CheckOptions{Pairing::paired, true, 3}),
                 Catch::Contains("holds 4 live micro-batches at F3, more than its 3 activation slots"));
    REQUIRE(error_of(one_f_one_b(2, 4), CheckOptions{Pairing::paired, true, 2}).empty());
  }
}
