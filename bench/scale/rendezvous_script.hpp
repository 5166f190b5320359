// The rendezvous store requests one rank makes while it builds its communicators, in the
// order the real backends make them, with the values they write and what each read must
// return. The scale harness replays them against the coordinator's store; reading back
// exactly what each peer wrote is the check that every rank got its peers.
//
//   nccl: per group (world, dp, tp, pp, emb: those of more than one rank, in the engine's
//         order), group rank 0 sets "<prefix>nccl_unique_id" (128 bytes), the others get it
//         (comm/nccl/nccl_comm.cpp).
//   gloo: per group but the world (which connects no pair), comm/gloo/gloo_comm.cpp's
//         PeerContext: set "pair/<r>/<i>" = a 136-byte address for every peer i, then get
//         "pair/<i>/<r>" of every peer; then ShmGroup::create for groups of at most 256
//         ranks (comm/gloo/shm_group.cpp): set shm/host/<r>, wait for every rank's, read them
//         until one differs; a group on one host shares the name rank 0 sets.
//
// Keys carry the PrefixStore prefix of comm::store_prefix ("<job>/g<gen>/world/") and, for
// a group, its name ("<job>/g<gen>/world/dp3/").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::scale {

enum class Pattern { nccl, gloo };

struct StoreOp {
  enum class Kind { set, get } kind = Kind::get;
  std::string key;
  std::string value;   // set: the bytes written
  std::string expect;  // get: the bytes the read must hold at expect_at ("" = any)
  size_t expect_at = 0;
  int group = 0;  // index into RendezvousScript::groups()
  // get of a shm host key: a value that is not `expect` ends the group's shm attempt (not an error).
  bool shm_probe = false;
};

struct Group {
  std::string name;    // "world", "dp3", "tp0", "pp12", "emb0"
  std::string prefix;  // the store prefix of its communicator
  std::vector<int> ranks;
  int me = 0;  // this rank's index in the group
};

// The groups of `rank` under layout dp x pp x tp (rank = (d * pp + p) * tp + t), in the order
// the engine builds them (worker/engine.cpp: connect): world, dp, tp, pp, emb.
std::vector<Group> rank_groups(const std::string& job, int generation, int dp, int pp, int tp, int rank);

class RendezvousScript {
 public:
  // gloo_max: groups of more ranks than this skip the gloo pattern (a group's full mesh
  // costs 2 n (n - 1) requests); 0 = no limit.
  // host: the host name this rank writes (the shm host key).
  RendezvousScript(Pattern pattern, std::vector<Group> groups, std::string host, int gloo_max = 0);
  // The next request, or nullopt when the rank is done.
  std::optional<StoreOp> next();
  // A shm probe read another host: the rest of that group's shm attempt is skipped.
  void shm_mismatch();
  const std::vector<Group>& groups() const { return groups_; }
  int64_t issued() const { return issued_; }
  int skipped_groups() const { return skipped_; }

  // The value a peer writes, so that a reader can check it.
  static std::string nccl_id(const std::string& prefix, int root);
  static std::string gloo_address(const std::string& prefix, int from, int to);  // 136 bytes
  static constexpr size_t kAddressBytes = 136;
  static constexpr int kShmMaxRanks = 256;

 private:
  // Where the rank is within groups_[g_]: a phase of the pattern and a counter within it.
  enum class Phase { start, pair_set, pair_get, shm_set, shm_wait, shm_check, shm_name, done };
  std::optional<StoreOp> step();  // the next op of groups_[g_], advancing the phase

  Pattern pattern_;
  std::vector<Group> groups_;
  std::string host_;
  int gloo_max_;
  size_t g_ = 0;
  Phase phase_ = Phase::start;
  int i_ = 0;  // counter within the phase
  int64_t issued_ = 0;
  int skipped_ = 0;
};

}  // namespace troupe::scale
