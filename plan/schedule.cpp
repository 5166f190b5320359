#include "plan/schedule.hpp"

#include <algorithm>
#include <map>
#include <sstream>

namespace troupe::plan {

namespace {

std::string describe_rank_op(int rank, size_t index, const Op& op) {
  return "rank " + std::to_string(rank) + " op #" + std::to_string(index) + " (" + to_string(op) + ")";
}

const char* carry_name(Carry c) { return c == Carry::activation ? "activations" : "gradient"; }

}  // namespace

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

// ---- checker ----------------------------------------------------------------

namespace {

// A rank's program as the simulation reads it (owned by the Simulator, shared by its runs).
struct ProgView {
  const std::vector<ProgramStep>* v = nullptr;
  const ProgramStep& operator[](size_t i) const { return (*v)[i]; }
  size_t size() const { return v->size(); }
  std::vector<ProgramStep>::const_iterator begin() const { return v->begin(); }
  std::vector<ProgramStep>::const_iterator end() const { return v->end(); }
};

struct SimRank {
  ProgView prog;
  size_t at = 0;
  double clock = 0.0;
  bool arrived = false;  // at prog[at], a batch, posted
  double post_time = 0.0;
  std::vector<char> matched;  // per transfer of the current batch
  std::vector<double> match_time;
  size_t last_compute = SIZE_MAX;  // index into prog of the last compute step done
  bool done() const { return at >= prog.size(); }
};

std::string transfer_text(int rank, const Transfer& t) {
  std::ostringstream os;
  os << "rank " << rank << (t.send ? " sends " : " receives ") << carry_name(t.carry) << " of micro-batch "
     << t.mb << (t.send ? " to" : " from") << " rank " << t.peer << " (for model chunk " << t.dest << ")";
  return os.str();
}

std::string position_text(const SimRank& r) {
  std::ostringstream os;
  bool seen = false;
  for (size_t i = r.at + 1; i < r.prog.size(); ++i)
    if (r.prog[i].compute) {
      os << "before " << to_string(r.prog[i].op);
      seen = true;
      break;
    }
  if (r.last_compute != SIZE_MAX)
    os << (seen ? ", " : "") << "after " << to_string(r.prog[r.last_compute].op);
  return os.str();
}

// Static consistency: ranges, each (chunk, mb) F and B exactly once, F first;
// where the backward is split also W exactly once, after its B, and elsewhere no W.
void check_table(const Schedule& s) {
  if (s.pp < 1 || s.v < 1 || s.m < 1)
    throw ScheduleError("schedule sizes pipeline " + std::to_string(s.pp) + ", virtual " +
                        std::to_string(s.v) + ", micro-batches " + std::to_string(s.m) + " must be >= 1");
  if (static_cast<int>(s.ranks.size()) != s.pp)
    throw ScheduleError("schedule has " + std::to_string(s.ranks.size()) + " rank tables for pipeline " +
                        std::to_string(s.pp));
  for (int p = 0; p < s.pp; ++p) {
    // state[chunk][mb]: 0 nothing, 1 forwarded, 2 backwarded, 3 weight gradients done
    std::vector<std::vector<int>> state(s.v, std::vector<int>(s.m, 0));
    for (size_t i = 0; i < s.ranks[p].size(); ++i) {
      const Op& op = s.ranks[p][i];
      if (op.mb < 0 || op.mb >= s.m || op.chunk < 0 || op.chunk >= s.v)
        throw ScheduleError(describe_rank_op(p, i, op) + ": micro-batch must be in [0, " +
                            std::to_string(s.m) + ") and chunk in [0, " + std::to_string(s.v) + ")");
      int& st = state[op.chunk][op.mb];
      if (op.pass == Pass::F) {
        if (st != 0) throw ScheduleError(describe_rank_op(p, i, op) + ": duplicate F of this micro-batch");
        st = 1;
      } else if (op.pass == Pass::B) {
        if (st == 0) throw ScheduleError(describe_rank_op(p, i, op) + ": B before its F");
        if (st >= 2) throw ScheduleError(describe_rank_op(p, i, op) + ": duplicate B of this micro-batch");
        st = 2;
      } else {
        if (!s.split_backward())
          throw ScheduleError(describe_rank_op(p, i, op) + ": W in a " + schedule_name(s.kind) +
                              " schedule, whose B computes the weight gradients too");
        if (st < 2) throw ScheduleError(describe_rank_op(p, i, op) + ": W before its B");
        if (st == 3) throw ScheduleError(describe_rank_op(p, i, op) + ": duplicate W of this micro-batch");
        st = 3;
      }
    }
  }
}

// Every send has its receive and vice versa (before any ordering question).
void check_matching(const Schedule& s, const std::vector<SimRank>& ranks) {
  // (src, dst, tag) -> count, +1 per send, -1 per receive
  std::map<std::tuple<int, int, uint32_t>, std::pair<int, Transfer>> sends, recvs;
  for (int p = 0; p < s.pp; ++p)
    for (const auto& st : ranks[p].prog)
      for (const auto& t : st.batch) {
        auto key = t.send ? std::make_tuple(p, t.peer, t.tag) : std::make_tuple(t.peer, p, t.tag);
        auto& slot = (t.send ? sends : recvs)[key];
        slot.first++;
        slot.second = t;
      }
  std::vector<std::string> problems;
  for (const auto& [key, v] : sends)
    if (!recvs.count(key))
      problems.push_back("missing receive: " + transfer_text(std::get<0>(key), v.second) + ", but rank " +
                         std::to_string(std::get<1>(key)) + " never receives them (its table has no " +
                         (v.second.carry == Carry::activation ? "F" : "B") + " of micro-batch " +
                         std::to_string(v.second.mb) + " on that chunk)");
  for (const auto& [key, v] : recvs)
    if (!sends.count(key))
      problems.push_back("missing send: " + transfer_text(std::get<1>(key), v.second) + ", but rank " +
                         std::to_string(std::get<0>(key)) + " never sends them (its table has no " +
                         (v.second.carry == Carry::activation ? "F" : "B") + " of micro-batch " +
                         std::to_string(v.second.mb) + " on that chunk)");
  if (!problems.empty()) {
    std::string msg = problems[0];
    for (size_t i = 1; i < problems.size() && i < 4; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 4) msg += "\n  (" + std::to_string(problems.size() - 4) + " more)";
    throw ScheduleError(msg);
  }
  // Completeness (a single stage has no transfers to reveal a missing op; a W
  // never has any).
  for (int p = 0; p < s.pp; ++p) {
    std::vector<int> f(static_cast<size_t>(s.v) * s.m, 0), b(f.size(), 0), w(f.size(), 0);
    for (const Op& op : s.ranks[p])
      (op.pass == Pass::F ? f : op.pass == Pass::B ? b : w)[static_cast<size_t>(op.chunk) * s.m + op.mb]++;
    for (int c = 0; c < s.v; ++c)
      for (int mb = 0; mb < s.m; ++mb) {
        const size_t i = static_cast<size_t>(c) * s.m + mb;
        const bool no_w = s.split_backward() && !w[i];
        if (!f[i] || !b[i] || no_w)
          throw ScheduleError("rank " + std::to_string(p) + " chunk " + std::to_string(c) + ": micro-batch " +
                              std::to_string(mb) + " has no " +
                              (!f[i] && !b[i] ? "F and no B"
                               : !f[i]        ? "F"
                               : !b[i]        ? "B"
                                              : "W"));
      }
  }
}

}  // namespace

Simulator::Simulator(const Schedule& s, Pairing pairing) : s_(s), pairing_(pairing) {
  check_table(s_);
  std::vector<SimRank> ranks(s_.pp);
  progs_.resize(size_t(s_.pp));
  for (int p = 0; p < s_.pp; ++p) {
    progs_[size_t(p)] = rank_program(s_, p, pairing_);
    ranks[size_t(p)].prog.v = &progs_[size_t(p)];
  }
  check_matching(s_, ranks);
}

CheckResult check_schedule(const Schedule& s, const CheckOptions& opt) {
  return Simulator(s, opt.pairing).run(opt);
}

CheckResult Simulator::run(const CheckOptions& opt) const {
  const Schedule& s = s_;
  if (opt.pairing != pairing_)
    throw ScheduleError("the simulator was built for another pairing of sends and receives");
  if (s.split_backward() && !(opt.t_weight >= 0.0 && opt.t_weight <= opt.t_backward))
    throw ScheduleError("t_weight " + std::to_string(opt.t_weight) + " must be in [0, t_backward = " +
                        std::to_string(opt.t_backward) + "]: W is part of the backward");
  std::vector<SimRank> ranks(s.pp);
  for (int p = 0; p < s.pp; ++p) ranks[p].prog.v = &progs_[size_t(p)];

  CheckResult res;
  res.peak_in_flight.assign(s.pp, std::vector<int>(s.v, 0));
  res.peak_per_rank.assign(s.pp, 0);
  res.busy.assign(s.pp, 0.0);
  std::vector<std::vector<int>> live(s.pp, std::vector<int>(s.v, 0));
  std::vector<int> live_rank(s.pp, 0);
  // Eager sends land in a mailbox: (src, dst, tag) -> time sent.
  std::map<std::tuple<int, int, uint32_t>, double> mailbox;

  std::vector<std::vector<int>> pending_free(s.pp, std::vector<int>(s.v, 0));
  auto arrive = [&](SimRank& r) {
    if (r.done() || r.arrived || r.prog[r.at].compute) return;
    const int p = static_cast<int>(&r - ranks.data());
    for (int c = 0; c < s.v; ++c) {
      live[p][c] -= pending_free[p][c];
      live_rank[p] -= pending_free[p][c];
      pending_free[p][c] = 0;
    }
    r.arrived = true;
    r.post_time = r.clock;
    r.matched.assign(r.prog[r.at].batch.size(), 0);
    r.match_time.assign(r.prog[r.at].batch.size(), r.clock);
  };

  // Runs the compute step ranks[p] is at (accounting its slots) and returns its
  // duration; the caller moves the clock.
  const bool split = s.split_backward();
  const bool per_chunk = !opt.chunk_forward.empty();
  if (per_chunk) {
    auto sized = [&](const std::vector<std::vector<double>>& t, const char* what, bool needed) {
      if (!needed) return;
      bool ok = static_cast<int>(t.size()) == s.pp;
      for (size_t p = 0; ok && p < t.size(); ++p) ok = static_cast<int>(t[p].size()) == s.v;
      if (!ok)
        throw ScheduleError(std::string(what) + " needs [pipeline " + std::to_string(s.pp) + "][virtual " +
                            std::to_string(s.v) + "] durations");
    };
    sized(opt.chunk_forward, "chunk_forward", true);
    sized(opt.chunk_backward, "chunk_backward", true);
    sized(opt.chunk_weight, "chunk_weight", split);
  }
  auto duration = [&](int p, const Op& op) {
    if (per_chunk) {
      const size_t c = static_cast<size_t>(op.chunk);
      if (op.pass == Pass::F) return opt.chunk_forward[p][c];
      if (op.pass == Pass::W) return opt.chunk_weight[p][c];
      return split ? opt.chunk_backward[p][c] - opt.chunk_weight[p][c] : opt.chunk_backward[p][c];
    }
    return (op.pass == Pass::F   ? opt.t_forward
            : op.pass == Pass::W ? opt.t_weight
            : split              ? opt.t_backward - opt.t_weight
                                 : opt.t_backward) /
           s.v;
  };
  res.transfer.assign(s.pp, 0.0);
  auto run_compute = [&](int p) {
    SimRank& r = ranks[p];
    const Op& op = r.prog[r.at].op;
    const double t = duration(p, op);
    res.busy[p] += t;
    int& l = live[p][op.chunk];
    if (op.pass == Pass::F) {
      ++l;
      ++live_rank[p];
      res.peak_in_flight[p][op.chunk] = std::max(res.peak_in_flight[p][op.chunk], l);
      res.peak_per_rank[p] = std::max(res.peak_per_rank[p], live_rank[p]);
      if (opt.max_slots > 0 && l > opt.max_slots)
        throw ScheduleError("rank " + std::to_string(p) + " chunk " + std::to_string(op.chunk) + " holds " +
                            std::to_string(l) + " live micro-batches at " + to_string(op) +
                            ", more than its " + std::to_string(opt.max_slots) + " activation slots");
    } else if (op.pass == Pass::W) {
      // The weight gradients were the last use of the saved activations.
      --l;
      --live_rank[p];
    } else if (!split) {
      // The executor frees a slot once the batch after the op's group has
      // sent its input gradient (model chunk 0 sends none: freed at once).
      if (op.chunk * s.pp + p > 0) {
        ++pending_free[p][op.chunk];
      } else {
        --l;
        --live_rank[p];
      }
    }
    r.last_compute = r.at;
    ++r.at;
    return t;
  };

  for (;;) {
    bool progress = false, all_done = true;
    for (int p = 0; p < s.pp; ++p) {
      SimRank& r = ranks[p];
      if (r.done()) continue;
      all_done = false;
      const ProgramStep& st = r.prog[r.at];
      if (st.compute) {
        r.clock += run_compute(p);
        progress = true;
        arrive(r);
        continue;
      }
      arrive(r);
      const auto& batch = st.batch;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (r.matched[i]) continue;
        const Transfer& t = batch[i];
        if (!opt.rendezvous) {
          if (t.send) {
            mailbox[{p, t.peer, t.tag}] = r.post_time;
            r.matched[i] = 1;
            progress = true;
          } else {
            auto it = mailbox.find({t.peer, p, t.tag});
            if (it != mailbox.end()) {
              r.matched[i] = 1;
              r.match_time[i] = std::max(r.post_time, it->second);
              mailbox.erase(it);
              progress = true;
            }
          }
          continue;
        }
        SimRank& q = ranks[t.peer];
        arrive(q);
        if (q.done() || !q.arrived) continue;
        auto& qb = q.prog[q.at].batch;
        for (size_t j = 0; j < qb.size(); ++j)
          if (!q.matched[j] && qb[j].send != t.send && qb[j].peer == p && qb[j].tag == t.tag) {
            const double when = std::max(r.post_time, q.post_time);
            r.matched[i] = q.matched[j] = 1;
            r.match_time[i] = q.match_time[j] = when;
            progress = true;
            break;
          }
      }
      if (std::all_of(r.matched.begin(), r.matched.end(), [](char c) { return c != 0; })) {
        r.clock = std::max(r.post_time, *std::max_element(r.match_time.begin(), r.match_time.end()));
        if (opt.t_transfer > 0.0) {
          const auto sends =
              std::count_if(batch.begin(), batch.end(), [](const Transfer& x) { return x.send; });
          const double moving =
              opt.t_transfer * double(std::max<size_t>(size_t(sends), batch.size() - sends));
          r.clock += moving;
          res.transfer[p] += moving;
        }
        r.arrived = false;
        ++r.at;
        ++res.comm_batches;
        if (opt.overlap_weights) {
          // The W's that follow the batch ran from the moment it was posted.
          double t = r.post_time;
          while (!r.done() && r.prog[r.at].compute && r.prog[r.at].op.pass == Pass::W) t += run_compute(p);
          r.clock = std::max(r.clock, t);
        }
        progress = true;
        arrive(r);
      }
    }
    if (all_done) break;
    if (progress) continue;

    // Stuck: describe who waits for whom, and name a wait cycle when there is one.
    std::vector<int> waits_on(s.pp, -1);
    std::ostringstream os;
    for (int p = 0; p < s.pp; ++p) {
      const SimRank& r = ranks[p];
      if (r.done()) continue;
      const auto& batch = r.prog[r.at].batch;
      for (size_t i = 0; i < batch.size(); ++i)
        if (!r.matched[i]) {
          if (waits_on[p] < 0) waits_on[p] = batch[i].peer;
          os << "\n  " << transfer_text(p, batch[i]) << ", blocked " << position_text(r);
        }
    }
    std::string cycle;
    for (int start = 0; start < s.pp && cycle.empty(); ++start) {
      std::vector<int> seen(s.pp, -1);
      int p = start;
      for (int n = 0; p >= 0 && seen[p] < 0; ++n) {
        seen[p] = n;
        p = waits_on[p];
      }
      if (p >= 0) {
        int q = p;
        do {
          cycle += (cycle.empty() ? "" : " -> ") + std::string("rank ") + std::to_string(q);
          q = waits_on[q];
        } while (q != p);
        cycle += " -> rank " + std::to_string(p);
      }
    }
    throw ScheduleError("deadlock" +
                        (cycle.empty() ? std::string() : ": crossed order, wait cycle " + cycle) + " (" +
                        (opt.rendezvous ? "rendezvous" : "eager") + " sends, " +
                        (opt.pairing == Pairing::paired ? "paired" : "unpaired") + " batches):" + os.str());
  }

  for (const auto& r : ranks) res.makespan = std::max(res.makespan, r.clock);
  double idle = 0.0;
  for (int p = 0; p < s.pp; ++p)
    idle += res.makespan > 0 ? (res.makespan - res.busy[p] - res.transfer[p]) / res.makespan : 0.0;
  res.bubble = idle / s.pp;
  return res;
}

double theoretical_bubble(ScheduleKind kind, int pp, int v, int m) {
  // zb-h1, F = B = W = 1: each rank idles p - 1 units of m * 3 busy ones.
  if (kind == ScheduleKind::zb_h1) return (pp - 1.0) / (3.0 * m + pp - 1.0);
  const double p = pp, mm = m, vv = kind == ScheduleKind::interleaved ? v : 1;
  return (p - 1) / (vv * mm + p - 1);
}

int activation_slots(const CheckResult& check, int pp, int p, int c) {
  if (pp == 1) return 1;
  return std::max(1, check.peak_in_flight.at(size_t(p)).at(size_t(c)));
}

}  // namespace troupe::plan
