// The communication a schedule table implies, derived once for the checker and the executor:
// each op's receive and send, and a rank's program of compute steps and communication batches.
#include "plan/schedule.hpp"

namespace troupe::plan {

uint32_t transfer_tag(Carry carry, int mb, int dest_chunk, int n_chunks) {
  return static_cast<uint32_t>((static_cast<int64_t>(mb) * n_chunks + dest_chunk) * 2 +
                               (carry == Carry::gradient ? 1 : 0));
}

namespace {

// What op needs before it runs (at most one receive) and what it produces
// (at most one send), from the rank's point of view.
struct OpComm {
  bool has_in = false, has_out = false;
  Transfer in, out;
};

OpComm op_comm(const Schedule& s, int rank, const Op& op) {
  const int S = s.n_chunks();
  const int k = op.chunk * s.pp + rank;
  OpComm c;
  auto make = [&](bool send, Carry carry, int other_chunk, int dest) {
    Transfer t;
    t.send = send;
    t.carry = carry;
    t.peer = other_chunk % s.pp;
    t.mb = op.mb;
    t.dest = dest;
    t.tag = transfer_tag(carry, op.mb, dest, S);
    return t;
  };
  if (op.pass == Pass::W) return c;  // weight gradients stay on the rank
  if (op.pass == Pass::F) {
    if (k > 0) c.has_in = true, c.in = make(false, Carry::activation, k - 1, k);
    if (k < S - 1) c.has_out = true, c.out = make(true, Carry::activation, k + 1, k + 1);
  } else {
    if (k < S - 1) c.has_in = true, c.in = make(false, Carry::gradient, k + 1, k);
    if (k > 0) c.has_out = true, c.out = make(true, Carry::gradient, k - 1, k - 1);
  }
  return c;
}

}  // namespace

std::vector<ProgramStep> rank_program(const Schedule& s, int rank, Pairing pairing) {
  TROUPE_CHECK(rank >= 0 && rank < s.pp && static_cast<int>(s.ranks.size()) == s.pp, "rank ", rank,
               " of a schedule with ", s.ranks.size(), " rank tables for pipeline ", s.pp);
  const auto& ops = s.ranks[rank];
  std::vector<ProgramStep> prog;
  auto post = [&](std::vector<Transfer> b) {
    if (!b.empty()) prog.push_back({false, {}, std::move(b)});
  };
  auto compute = [&](const Op& op) { prog.push_back({true, op, {}}); };
  if (pairing == Pairing::unpaired) {
    for (const Op& op : ops) {
      OpComm c = op_comm(s, rank, op);
      if (c.has_in) post({c.in});
      compute(op);
      if (c.has_out) post({c.out});
    }
    return prog;
  }
  // Communication groups: runs of F/B ops joined by `fused`. Before a group its
  // inputs arrive; after it its outputs leave, in one batch with the next
  // group's inputs. W ops communicate nothing and join no group: each runs after
  // the batch that follows the group before it, so the F/B batches are the ones
  // the table has without its W's, and a B's input gradient leaves before the
  // W's queued behind it.
  struct Group {
    std::vector<size_t> ops;      // F/B, indices into the table
    std::vector<size_t> weights;  // W's after the group, run after its batch
  };
  std::vector<Group> groups;
  std::vector<size_t> leading;  // W's before any F/B
  bool joined = false;          // the last F/B was fused with the next
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].pass == Pass::W) {
      (groups.empty() ? leading : groups.back().weights).push_back(i);
      continue;
    }
    if (groups.empty() || !joined) groups.emplace_back();
    groups.back().ops.push_back(i);
    joined = ops[i].fused;
  }
  auto inputs = [&](size_t g, std::vector<Transfer>& b) {
    for (size_t i : groups[g].ops) {
      OpComm c = op_comm(s, rank, ops[i]);
      if (c.has_in) b.push_back(c.in);
    }
  };
  for (size_t i : leading) compute(ops[i]);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == 0) {
      std::vector<Transfer> b;
      inputs(0, b);
      post(std::move(b));
    }
    for (size_t i : groups[g].ops) compute(ops[i]);
    std::vector<Transfer> b;
    for (size_t i : groups[g].ops) {
      OpComm c = op_comm(s, rank, ops[i]);
      if (c.has_out) b.push_back(c.out);
    }
    if (g + 1 < groups.size()) inputs(g + 1, b);
    post(std::move(b));
    for (size_t i : groups[g].weights) compute(ops[i]);
  }
  return prog;
}

}  // namespace troupe::plan
