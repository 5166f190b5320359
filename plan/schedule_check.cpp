// The schedule checker: a table's consistency (each F, B and W once, in order), every send
// matched by a receive, and a simulation of the ranks' programs that finds deadlocks (naming
// the wait cycle), counts each chunk's live micro-batches and prices the step
// (plan::Simulator, shared with the cost model).
#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "plan/schedule.hpp"

namespace troupe::plan {

namespace {

std::string describe_rank_op(int rank, size_t index, const Op& op) {
  return "rank " + std::to_string(rank) + " op #" + std::to_string(index) + " (" + to_string(op) + ")";
}

const char* carry_name(Carry c) { return c == Carry::activation ? "activations" : "gradient"; }

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

int activation_slots(const CheckResult& check, int pp, int p, int c) {
  if (pp == 1) return 1;
  return std::max(1, check.peak_in_flight.at(size_t(p)).at(size_t(c)));
}

}  // namespace troupe::plan
