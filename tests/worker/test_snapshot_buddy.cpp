// Buddies (worker/snapshot_buddy.hpp): a ring of ranks (threads over the local backend) copies
// each rank's snapshot into its buddy's memory, confirms it, and heals a rank started anew from
// the copy; a damaged copy is refused by its checksum; a hostile header is refused before
// anything is allocated.
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "worker/memory_snapshot.hpp"
#include "worker/snapshot_buddy.hpp"

using namespace troupe;

namespace {

// Rank r's state at step `step`: tensors whose values name both.
RankState state_of(int rank, int64_t step) {
  RankState s;
  s.next_step = step;
  s.rank = rank;
  s.fingerprint = "test rank " + std::to_string(rank);
  s.tensors = {
      std::vector<float>(size_t(100 + rank), float(rank) + 0.5f), {}, std::vector<float>(7, float(step))};
  s.loss_scale.scale = 1024.0 * (rank + 1);
  s.loss_scale.clean_steps = step;
  s.replicated = rank % 2 == 0;
  return s;
}

bool same(const RankState& a, const RankState& b) {
  return a.rank == b.rank && a.fingerprint == b.fingerprint && a.tensors == b.tensors &&
         a.loss_scale.scale == b.loss_scale.scale && a.loss_scale.clean_steps == b.loss_scale.clean_steps &&
         a.replicated == b.replicated;
}

struct Ring {
  int world;
  int shift;
  std::shared_ptr<comm::LocalWorld> local;
  std::vector<MemorySnapshots> own, held;
  int64_t generation = 0;
  Ring(int n, int s)
      : world(n), shift(s), local(comm::make_local_world(n)), own(size_t(n)), held(size_t(n)) {}

  std::unique_ptr<BuddyLink> link(int r, bool corrupt = false) {
    comm::CommConfig c;
    c.backend = "local";
    c.local_world = local;
    c.rank = r;
    c.size = world;
    c.generation = generation;
    c.group = "buddy";
    comm::Options opt;
    opt.timeout = std::chrono::milliseconds(20000);
    return std::make_unique<BuddyLink>(comm::make_communicator(c), BuddyRing{world, shift}, &held[size_t(r)],
                                       opt, corrupt);
  }
  // Every rank takes its snapshots of steps from..to-1 and offers each to its buddy.
  void exchange(int64_t from, int64_t to, bool corrupt, std::vector<int64_t>* confirmed) {
    std::vector<std::thread> ts;
    std::vector<std::string> errors(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        try {
          auto l = link(r, corrupt);
          for (int64_t k = from; k < to; ++k) {
            l->wait();
            RankState& slot = own[size_t(r)].begin();
            slot = state_of(r, k);
            own[size_t(r)].commit(slot, k);
            l->offer(&slot);
          }
          l->wait();
          (*confirmed)[size_t(r)] = l->confirmed();
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : ts) t.join();
    for (const auto& e : errors) REQUIRE(e == "");
    ++generation;
  }
};

}  // namespace

TEST_CASE("buddies: each snapshot is copied into the buddy's memory and confirmed", "[buddy]") {
  for (int shift : {1, 2}) {
    INFO("shift " << shift);
    Ring ring(3, shift);
    std::vector<int64_t> confirmed(3, -1);
    ring.exchange(4, 7, false, &confirmed);
    const BuddyRing br{3, shift};
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r);
      CHECK(confirmed[size_t(r)] == 6);
      // It holds its partner's two newest, as they were taken.
      const int p = br.partner(r);
      CHECK(ring.held[size_t(r)].rank() == p);
      CHECK(ring.held[size_t(r)].held() == std::vector<int64_t>{6, 5});
      for (int64_t k : {5, 6}) {
        const RankState* c = ring.held[size_t(r)].find(k);
        REQUIRE(c != nullptr);
        CHECK(same(*c, state_of(p, k)));
        CHECK(c->checksum == state_checksum(*c));
      }
    }
  }
}

TEST_CASE("buddies: a rank started anew receives its state from its buddy, a damaged copy is refused",
          "[buddy]") {
  for (bool corrupt : {false, true}) {
    INFO((corrupt ? "copies damaged in memory" : "copies whole"));
    Ring ring(2, 1);
    std::vector<int64_t> confirmed(2, -1);
    ring.exchange(0, 3, corrupt, &confirmed);
    CHECK(confirmed[0] == 2);  // checked before the damage: confirmed all the same
    // Rank 1 is started anew: nothing of its own. Rank 0 holds its copy of step 2.
    ring.own[1].clear();
    std::string errors[2];
    std::thread ts[2];
    for (int r = 0; r < 2; ++r)
      ts[r] = std::thread([&, r] {
        try {
          auto l = ring.link(r);
          l->heal(/*receive=*/r == 1, /*send=*/r == 0, 2, 1 << 20, ring.own[size_t(r)]);
        } catch (const SnapshotCorrupt& e) {
          errors[r] = std::string("corrupt: ") + e.what();
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ts) t.join();
    CHECK(errors[0] == "");
    if (corrupt) {
      CHECK(errors[1].find(
                "corrupt: the in-memory snapshot of rank 1 of step 2 held by rank 0 fails its checksum") ==
            0);
      CHECK(ring.own[1].find(2) == nullptr);  // nothing restored
    } else {
      CHECK(errors[1] == "");
      const RankState* s = ring.own[1].find(2);
      REQUIRE(s != nullptr);
      CHECK(same(*s, state_of(1, 2)));
    }
  }
}

TEST_CASE("buddies: a hostile copy header is refused before anything is allocated", "[buddy][hostile]") {
  RankState s = state_of(3, 9);
  const std::string good = buddy_wire::encode_header(s, 77);
  RankState in;
  CHECK(buddy_wire::decode_header(good, int64_t(1) << 20, &in) == 9);
  CHECK(in.next_step == -1);  // marked empty until its bytes are checked
  CHECK(in.checksum == 77);
  CHECK(in.rank == 3);
  REQUIRE(in.tensors.size() == 3);
  CHECK(in.tensors[0].size() == 103);
  // Every truncation, a bad magic, a size past the limit, trailing bytes.
  for (size_t n = 0; n < good.size(); ++n)
    CHECK_THROWS_AS(buddy_wire::decode_header(good.substr(0, n), 1 << 20, &in), Error);
  std::string bad = good;
  bad[0] ^= 1;
  CHECK_THROWS_WITH(buddy_wire::decode_header(bad, 1 << 20, &in), Catch::Contains("not a snapshot header"));
  CHECK_THROWS_WITH(buddy_wire::decode_header(good, 100, &in), Catch::Contains("bytes of tensors"));
  CHECK_THROWS_WITH(buddy_wire::decode_header(good + "x", 1 << 20, &in), Catch::Contains("after the header"));
  RankState huge = s;
  huge.tensors.assign(1, {});
  std::string h = buddy_wire::encode_header(huge, 0);
  // The one size, rewritten to 2^62 floats.
  const uint64_t big = uint64_t(1) << 62;
  std::memcpy(&h[h.size() - 8], &big, 8);
  CHECK_THROWS_WITH(buddy_wire::decode_header(h, int64_t(1) << 40, &in), Catch::Contains("bytes of tensors"));
}
