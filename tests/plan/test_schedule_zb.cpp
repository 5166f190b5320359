// ZB-H1: the table, the W ops in the derived program, and what the checker proves of it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "plan/schedule.hpp"
#include "tests/plan/schedule_util.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

// "B1 [>g1@0 <a4@0] W0 F4": compute steps, and batches of sends (>) and
// receives (<) of activations (a) or gradients (g) of a micro-batch, @ peer.
std::string program_text(const std::vector<ProgramStep>& prog) {
  std::string out;
  for (const ProgramStep& st : prog) {
    if (!out.empty()) out += " ";
    if (st.compute) {
      out += to_string(st.op);
      continue;
    }
    out += "[";
    for (size_t i = 0; i < st.batch.size(); ++i) {
      const Transfer& t = st.batch[i];
      out += std::string(i ? " " : "") + (t.send ? ">" : "<") + (t.carry == Carry::activation ? "a" : "g") +
             std::to_string(t.mb) + "@" + std::to_string(t.peer);
    }
    out += "]";
  }
  return out;
}

std::vector<ProgramStep> without_weights(std::vector<ProgramStep> prog) {
  prog.erase(std::remove_if(prog.begin(), prog.end(),
                            [](const ProgramStep& st) { return st.compute && st.op.pass == Pass::W; }),
             prog.end());
  return prog;
}

// W's wait for the batch before them instead of running while it is in flight.
CheckOptions after_batch() {
  CheckOptions o;
  o.overlap_weights = false;
  return o;
}

}  // namespace

TEST_CASE("schedule: ZB-H1 is 1F1B with each rank's W's held back by its rank", "[parallel][schedule]") {
  Schedule s = zb_h1(4, 6);
  // rank p: 1F1B's F/B order, W of micro-batch k - p after the B of k, the rest at the end.
  REQUIRE(table_text(s) ==
          "rank 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5\n"
          "rank 1: F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5\n"
          "rank 2: F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5\n"
          "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5\n");
  // fewer micro-batches than stages
  REQUIRE(table_text(zb_h1(4, 2)) ==
          "rank 0: F0 F1 B0 W0 B1 W1\nrank 1: F0 F1 B0 B1 W0 W1\n"
          "rank 2: F0 F1 B0 B1 W0 W1\nrank 3: F0 B0 F1 B1 W0 W1\n");
  REQUIRE(table_text(zb_h1(1, 2)) == "rank 0: F0 B0 W0 F1 B1 W1\n");
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      Schedule z = zb_h1(pp, m), o = one_f_one_b(pp, m);
      INFO("pp " << pp << " m " << m);
      for (int p = 0; p < pp; ++p) {
        // Without its W's the table is 1F1B's, and its W's run in micro-batch order.
        std::vector<Op> fb, w;
        for (const Op& op : z.ranks[p]) (op.pass == Pass::W ? w : fb).push_back(op);
        REQUIRE(fb == o.ranks[p]);
        for (int k = 0; k < m; ++k) REQUIRE(w.at(k).mb == k);
      }
    }

  REQUIRE(to_string(Op{Pass::W, 3, 0}) == "W3");
  REQUIRE(to_string(Op{Pass::W, 3, 1}) == "W3.1");
  REQUIRE(s.split_backward());
  REQUIRE_FALSE(one_f_one_b(4, 6).split_backward());
  REQUIRE_FALSE(interleaved_1f1b(2, 2, 4).split_backward());
  REQUIRE(std::string(schedule_name(ScheduleKind::zb_h1)) == "zb-h1");
  REQUIRE(schedule_from_name("zb-h1") == ScheduleKind::zb_h1);
  REQUIRE_THROWS_WITH(schedule_from_name("zb"), Catch::Contains("(gpipe, 1f1b, interleaved, zb-h1)"));
  REQUIRE(table_text(make_schedule(ScheduleKind::zb_h1, 4, 1, 6)) == table_text(s));
  REQUIRE_THROWS_WITH(make_schedule(ScheduleKind::zb_h1, 4, 2, 8),
                      Catch::Contains("one chunk per rank (got virtual stages 2)") &&
                          Catch::Contains("use virtual stages 1"));
  REQUIRE_THROWS_AS(zb_h1(0, 4), Error);
  REQUIRE_THROWS_AS(zb_h1(2, 0), Error);
  // F = B = W: the idle (p-1) units per rank over 3m busy ones.
  REQUIRE(theoretical_bubble(ScheduleKind::zb_h1, 4, 1, 8) == Approx(3.0 / 27));
  REQUIRE(theoretical_bubble(ScheduleKind::zb_h1, 1, 1, 8) == 0.0);
}

TEST_CASE("schedule: W ops are compute steps after the batch that sends their B's gradient",
          "[parallel][schedule]") {
  Schedule s = zb_h1(4, 6);
  // rank 1: B1's gradient leaves (with F4's activations arriving) before W0 runs;
  // the W's that follow the last B come after the batch that sends its gradient.
  REQUIRE(program_text(rank_program(s, 1)) ==
          "[<a0@0] F0 [>a0@2 <a1@0] F1 [>a1@2 <a2@0] F2 [>a2@2 <g0@2] B0 [>g0@0 <a3@0] F3 [>a3@2 <g1@2] "
          "B1 [>g1@0 <a4@0] W0 F4 [>a4@2 <g2@2] B2 [>g2@0 <a5@0] W1 F5 [>a5@2 <g3@2] B3 [>g3@0 <g4@2] W2 "
          "B4 [>g4@0 <g5@2] W3 B5 [>g5@0] W4 W5");
  // rank 0 (model chunk 0) sends no gradient: its W's follow its B's at once.
  REQUIRE(program_text(rank_program(s, 0)).find("[>a3@1 <g0@1] B0 W0 F4 [>a4@1 <g1@1] B1 W1") !=
          std::string::npos);
  // Unpaired, a W is a compute step with nothing around it.
  REQUIRE(program_text(rank_program(s, 1, Pairing::unpaired)).find("B1 [>g1@0] W0 [<a4@0] F4") !=
          std::string::npos);
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m)
      for (int p = 0; p < pp; ++p) {
        INFO("pp " << pp << " m " << m << " rank " << p);
        const auto prog = rank_program(zb_h1(pp, m), p);
        // The F/B communication is exactly 1F1B's ...
        REQUIRE(program_text(without_weights(prog)) == program_text(rank_program(one_f_one_b(pp, m), p)));
        // ... and every W comes after a batch or another W, never between an
        // F/B and the batch that sends its output.
        for (size_t i = 0; i < prog.size(); ++i)
          if (prog[i].compute && prog[i].op.pass == Pass::W) {
            REQUIRE(prog[i].batch.empty());
            REQUIRE(i > 0);
            const ProgramStep& before = prog[i - 1];
            const bool after_batch = !before.compute;
            const bool after_w = before.compute && before.op.pass == Pass::W;
            // model chunk 0 sends no gradient: no batch between its B and the W
            const bool after_silent_b = p == 0 && before.compute && before.op.pass == Pass::B;
            REQUIRE((after_batch || after_w || after_silent_b));
          }
      }
}

TEST_CASE("schedule: ZB-H1 is proven deadlock-free and holds no more than 1F1B on rank 0, pp 1-8, m 1-16",
          "[parallel][schedule]") {
  int checked = 0;
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      Schedule s = zb_h1(pp, m);
      INFO("pp " << pp << " m " << m);
      CheckResult r = check_schedule(s, after_batch());
      CheckResult eager = check_schedule(s, CheckOptions{Pairing::paired, false});
      CheckResult ov = check_schedule(s);
      CheckResult o = check_schedule(one_f_one_b(pp, m));
      for (int p = 0; p < pp; ++p) {
        // A slot is held from F to W: every rank holds what rank 0 holds in 1F1B.
        REQUIRE(r.peak_in_flight[p][0] == std::min(pp, m));
        REQUIRE(r.peak_per_rank[p] == std::min(pp, m));
        REQUIRE(eager.peak_per_rank[p] == r.peak_per_rank[p]);
        REQUIRE(ov.peak_per_rank[p] == r.peak_per_rank[p]);
        REQUIRE(r.busy[p] == Approx(3.0 * m));
      }
      REQUIRE(r.peak_per_rank[0] == o.peak_per_rank[0]);
      REQUIRE(error_of(s, CheckOptions{Pairing::paired, true, pp}).empty());
      // With W's after their batch, no better than 1F1B; with them overlapping
      // the batch (what runs), the textbook bubble once every rank reaches its
      // steady state (m >= pp), and never worse than 1F1B.
      REQUIRE(r.bubble <= o.bubble + 1e-12);
      REQUIRE(ov.bubble <= r.bubble + 1e-12);
      if (m >= pp) {
        REQUIRE(ov.bubble == Approx(theoretical_bubble(ScheduleKind::zb_h1, pp, 1, m)).margin(1e-12));
        REQUIRE(ov.makespan == Approx(3.0 * m + pp - 1));
      }
      ++checked;
    }
  REQUIRE(checked == 128);
  // Naive blocking send/recv deadlocks exactly as 1F1B's does.
  REQUIRE_THAT(error_of(zb_h1(2, 2), CheckOptions{Pairing::unpaired, true}),
               Catch::Contains("crossed order, wait cycle rank 0 -> rank 1 -> rank 0"));
}

TEST_CASE("schedule: ZB-H1's simulated bubble against 1F1B and interleaved, p 4", "[parallel][schedule]") {
  for (int m : {8, 16}) {
    INFO("m " << m);
    const double one = check_schedule(one_f_one_b(4, m)).bubble;
    const double inter = check_schedule(interleaved_1f1b(4, 2, m)).bubble;
    const double zb = check_schedule(zb_h1(4, m), after_batch()).bubble;
    const double zb_overlapped = check_schedule(zb_h1(4, m)).bubble;
    INFO("p 4 m " << m << ": 1f1b " << one << ", interleaved v 2 " << inter << ", zb-h1 " << zb
                  << " (W's overlapping their batch " << zb_overlapped << ")");
    REQUIRE(one == Approx(theoretical_bubble(ScheduleKind::one_f_one_b, 4, 1, m)));
    // Were each W to wait for the batch before it, whose receive is the next
    // op's input, no W would fill a wait and the step would take exactly as
    // long as 1F1B's (3 (m + p - 1)): the batch has to be in flight meanwhile.
    REQUIRE(zb == Approx(one).margin(1e-12));
    // W's run while the batch before them is in flight (the executor): the
    // textbook ZB-H1, (p-1) / (3m + p-1), about a third of 1F1B's.
    REQUIRE(zb_overlapped == Approx(theoretical_bubble(ScheduleKind::zb_h1, 4, 1, m)).margin(1e-12));
    REQUIRE(zb_overlapped < 0.5 * one);
  }
  // B and W of unequal cost: the overlapped bubble is (p-1)(F+B-W) / (m(F+B+W) + that).
  CheckOptions o;
  o.t_backward = 2.5;
  o.t_weight = 1.0;  // F 1, B 1.5, W 1
  const CheckResult r = check_schedule(zb_h1(4, 16), o);
  REQUIRE(r.busy[0] == Approx(16 * 3.5));
  REQUIRE(r.bubble == Approx(3 * 1.5 / (16 * 3.5 + 3 * 1.5)).margin(1e-12));
}

TEST_CASE("schedule: broken split-backward tables are rejected with a clear message",
          "[parallel][schedule]") {
  SECTION("W before its B") {
    Schedule s = zb_h1(2, 3);
    // rank 1: F0 B0 F1 B1 W0 F2 B2 W1 W2; W1 moves ahead of B1
    auto& ops = s.ranks[1];
    ops.erase(ops.begin() + 7);
    ops.insert(ops.begin() + 3, Op{Pass::W, 1, 0});
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 1 op #3 (W1): W before its B"));
  }
  SECTION("a W before its F") {
    Schedule s = zb_h1(1, 2);
    s.ranks[0] = {{Pass::W, 0, 0}, {Pass::F, 0, 0}, {Pass::B, 0, 0},
                  {Pass::F, 1, 0}, {Pass::B, 1, 0}, {Pass::W, 1, 0}};
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #0 (W0): W before its B"));
  }
  SECTION("a missing W") {
    Schedule s = zb_h1(4, 6);
    auto& ops = s.ranks[2];
    ops.erase(std::find(ops.begin(), ops.end(), Op{Pass::W, 3, 0}));
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 2 chunk 0: micro-batch 3 has no W"));
  }
  SECTION("a duplicate W") {
    Schedule s = zb_h1(2, 3);
    s.ranks[0].push_back(Op{Pass::W, 1, 0});
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #9 (W1): duplicate W of this micro-batch"));
  }
  SECTION("a duplicate B after its W") {
    Schedule s = zb_h1(1, 1);
    s.ranks[0].push_back(Op{Pass::B, 0, 0});
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #3 (B0): duplicate B"));
  }
  SECTION("a W in a schedule that does not split the backward") {
    Schedule s = one_f_one_b(2, 2);
    s.ranks[0].insert(s.ranks[0].begin() + 3, Op{Pass::W, 0, 0});
    REQUIRE_THAT(error_of(s), Catch::Contains("rank 0 op #3 (W0): W in a 1f1b schedule"));
  }
  SECTION("a W out of range") {
    Schedule s = zb_h1(2, 2);
    s.ranks[1].back().mb = 2;
    REQUIRE_THAT(error_of(s), Catch::Contains("micro-batch must be in [0, 2)"));
  }
}
