#include "bench/scale/rendezvous_script.hpp"

#include "comm/store.hpp"
#include "plan/grid.hpp"

namespace troupe::scale {

std::vector<Group> rank_groups(const std::string& job, int generation, int dp, int pp, int tp, int rank) {
  const plan::Layout layout{dp, pp, tp};
  const plan::Coord c = plan::coord_of(layout, rank);
  const std::string world = comm::store_prefix(job, generation, "world");
  std::vector<Group> out;
  auto add = [&](std::string name, std::vector<int> ranks) {
    Group g;
    g.prefix = name == "world" ? world : world + name + "/";
    g.name = std::move(name);
    g.ranks = std::move(ranks);
    for (size_t i = 0; i < g.ranks.size(); ++i)
      if (g.ranks[i] == rank) g.me = static_cast<int>(i);
    out.push_back(std::move(g));
  };
  auto rank_of = [&](int d, int p, int t) { return plan::rank_of(layout, {d, p, t}); };
  if (layout.world() > 1) {
    std::vector<int> all(layout.world());
    for (int r = 0; r < layout.world(); ++r) all[r] = r;
    add("world", std::move(all));
  }
  // comm::grid_groups numbers data groups by (p, t), tensor groups by (d, p), pipeline
  // groups by (d, t); group_name is the kind and that index.
  if (dp > 1) {
    std::vector<int> g;
    for (int d = 0; d < dp; ++d) g.push_back(rank_of(d, c.p, c.t));
    add("dp" + std::to_string(c.p * tp + c.t), std::move(g));
  }
  if (tp > 1) {
    std::vector<int> g;
    for (int t = 0; t < tp; ++t) g.push_back(rank_of(c.d, c.p, t));
    add("tp" + std::to_string(c.d * pp + c.p), std::move(g));
  }
  if (pp > 1) {
    std::vector<int> g;
    for (int p = 0; p < pp; ++p) g.push_back(rank_of(c.d, p, c.t));
    add("pp" + std::to_string(c.d * tp + c.t), std::move(g));
    // The tied embedding: the first and the last stage of this pipeline.
    if (c.p == 0 || c.p == pp - 1) {
      const int first = rank_of(c.d, 0, c.t);
      add("emb" + std::to_string(first), {first, rank_of(c.d, pp - 1, c.t)});
    }
  }
  return out;
}

std::string RendezvousScript::nccl_id(const std::string& prefix, int root) {
  std::string v = "nccl-unique-id " + prefix + " root " + std::to_string(root);
  v.resize(128, '.');
  return v;
}

std::string RendezvousScript::gloo_address(const std::string& prefix, int from, int to) {
  std::string v = "tcp " + prefix + " " + std::to_string(from) + "->" + std::to_string(to);
  v.resize(kAddressBytes, '.');
  return v;
}

RendezvousScript::RendezvousScript(Pattern pattern, std::vector<Group> groups, std::string host, int gloo_max)
    : pattern_(pattern), groups_(std::move(groups)), host_(std::move(host)), gloo_max_(gloo_max) {}

void RendezvousScript::shm_mismatch() {
  if (phase_ == Phase::shm_check) phase_ = Phase::done;
}

std::optional<StoreOp> RendezvousScript::next() {
  while (g_ < groups_.size()) {
    if (auto op = step()) {
      op->group = static_cast<int>(g_);
      ++issued_;
      return op;
    }
    ++g_;
    phase_ = Phase::start;
    i_ = 0;
  }
  return std::nullopt;
}

std::optional<StoreOp> RendezvousScript::step() {
  const Group& g = groups_[g_];
  const int n = static_cast<int>(g.ranks.size()), me = g.me;
  auto set = [&](std::string key, std::string value) {
    StoreOp op;
    op.kind = StoreOp::Kind::set;
    op.key = g.prefix + key;
    op.value = std::move(value);
    return op;
  };
  auto get = [&](std::string key, std::string expect, size_t at = 0) {
    StoreOp op;
    op.key = g.prefix + key;
    op.expect = std::move(expect);
    op.expect_at = at;
    return op;
  };
  if (pattern_ == Pattern::nccl) {
    if (phase_ != Phase::start) return std::nullopt;
    phase_ = Phase::done;
    return me == 0 ? set("nccl_unique_id", nccl_id(g.prefix, g.ranks[0]))
                   : get("nccl_unique_id", nccl_id(g.prefix, g.ranks[0]));
  }
  for (;;) {
    switch (phase_) {
      case Phase::start:
        // The world connects no pair (worker/engine.cpp: connect): nothing to publish.
        if (g.name == "world") return std::nullopt;
        if (gloo_max_ > 0 && n > gloo_max_) {
          ++skipped_;
          return std::nullopt;
        }
        phase_ = Phase::pair_set;
        i_ = 0;
        continue;
      case Phase::pair_set:
        // comm/gloo/gloo_comm.cpp (PeerContext): one address per peer, "pair/<me>/<peer>".
        if (i_ == me) ++i_;
        if (i_ < n) {
          const int j = i_++;
          return set("pair/" + std::to_string(me) + "/" + std::to_string(j),
                     gloo_address(g.prefix, g.ranks[me], g.ranks[j]));
        }
        phase_ = Phase::pair_get;
        i_ = 0;
        continue;
      case Phase::pair_get:
        if (i_ == me) ++i_;
        if (i_ < n) {
          const int j = i_++;
          return get("pair/" + std::to_string(j) + "/" + std::to_string(me),
                     gloo_address(g.prefix, g.ranks[j], g.ranks[me]));
        }
        phase_ = n <= kShmMaxRanks ? Phase::shm_set : Phase::done;
        continue;
      case Phase::shm_set:
        phase_ = Phase::shm_wait;
        i_ = 0;
        return set("shm/host/" + std::to_string(me), host_);
      case Phase::shm_wait:
        if (i_ < n) return get("shm/host/" + std::to_string(i_++), "");
        phase_ = Phase::shm_check;
        i_ = 0;
        continue;
      case Phase::shm_check:
        if (i_ < n) {
          StoreOp op = get("shm/host/" + std::to_string(i_++), host_);
          op.shm_probe = true;
          return op;
        }
        phase_ = Phase::shm_name;
        continue;
      case Phase::shm_name:
        phase_ = Phase::done;
        return me == 0 ? set("shm/name", "/troupe-shm-" + g.prefix)
                       : get("shm/name", "/troupe-shm-" + g.prefix);
      case Phase::done:
        return std::nullopt;
    }
  }
}

}  // namespace troupe::scale
