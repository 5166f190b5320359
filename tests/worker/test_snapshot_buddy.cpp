// Buddies (worker/snapshot_buddy.hpp): a ring of ranks (threads over the local backend) copies
// each rank's snapshot into its buddy's memory, or lets the buddy map it (the ranks share a
// host: worker/snapshot_segment.hpp), confirms it, and heals a rank started anew from the copy;
// a damaged copy is refused by its checksum; a hostile header or segment is refused before
// anything is allocated or mapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "worker/memory_snapshot.hpp"
#include "worker/snapshot_buddy.hpp"

using namespace troupe;

namespace {

// Rank r's state at step `step`, written into `s` where it lays out (its slot of a shared
// segment, or a block of its own): tensors whose values name both.
void fill(RankState& s, int rank, int64_t step) {
  s.next_step = step;
  s.rank = rank;
  s.fingerprint = "test rank " + std::to_string(rank);
  s.shape({size_t(100 + rank), 0, 7});
  std::fill(s.tensors[0].data(), s.tensors[0].data() + s.tensors[0].size(), float(rank) + 0.5f);
  std::fill(s.tensors[2].data(), s.tensors[2].data() + s.tensors[2].size(), float(step));
  s.loss_scale.scale = 1024.0 * (rank + 1);
  s.loss_scale.clean_steps = step;
  s.replicated = rank % 2 == 0;
}

std::vector<std::vector<float>> values(const RankState& s) {
  std::vector<std::vector<float>> out;
  for (const auto& t : s.tensors) out.emplace_back(t.data(), t.data() + t.size());
  return out;
}

bool same_as(const RankState& a, int rank, int64_t step) {
  RankState b;
  fill(b, rank, step);
  return a.rank == b.rank && a.fingerprint == b.fingerprint && values(a) == values(b) &&
         a.loss_scale.scale == b.loss_scale.scale && a.loss_scale.clean_steps == b.loss_scale.clean_steps &&
         a.replicated == b.replicated;
}

struct Ring {
  int world;
  int shift;
  bool shared;  // each rank's snapshots in a segment its buddy may map
  std::shared_ptr<comm::LocalWorld> local;
  std::vector<std::unique_ptr<MemorySnapshots>> own;  // each rank process's own
  std::vector<MemorySnapshots> held;
  std::vector<bool> maps;  // per rank: its link mapped the partner's segment
  int64_t generation = 0;
  Ring(int n, int s, bool shared_)
      : world(n),
        shift(s),
        shared(shared_),
        local(comm::make_local_world(n)),
        held(size_t(n)),
        maps(size_t(n), false) {
    for (int r = 0; r < n; ++r) {
      own.push_back(std::make_unique<MemorySnapshots>());
      if (!shared) continue;
      std::string why;
      own.back()->share(SnapshotSegment::create(4096, &why));
      REQUIRE(own.back()->shared() != nullptr);
    }
  }

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
    auto l = std::make_unique<BuddyLink>(comm::make_communicator(c), BuddyRing{world, shift},
                                         &held[size_t(r)], opt, corrupt, own[size_t(r)]->shared());
    maps[size_t(r)] = l->maps_partner();
    return l;
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
            RankState& slot = own[size_t(r)]->begin();
            fill(slot, r, k);
            slot.checksum = state_checksum(slot);
            own[size_t(r)]->commit(slot, k);
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
  for (int shift : {1, 2})
    for (bool shared : {false, true}) {
      INFO("shift " << shift << (shared ? ", segments mapped" : ", copies sent"));
      Ring ring(3, shift, shared);
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
          CHECK(same_as(*c, p, k));
          CHECK(c->checksum == state_checksum(*c));
          // Mapped: the partner's own pages, no copy in this rank's memory.
          CHECK((c->segment() != nullptr) == shared);
        }
        CHECK(ring.maps[size_t(r)] == shared);
        CHECK((ring.held[size_t(r)].bytes() == 0) == shared);
      }
      if (shared) {
        // The partner begins its next snapshot in the slot of step 5: from then on the buddy no
        // longer counts that copy, before a byte of it changes.
        const int p = br.partner(0);
        RankState& slot = ring.own[size_t(p)]->begin();
        CHECK(ring.held[0].held() == std::vector<int64_t>{6});
        CHECK(ring.held[0].find(5) == nullptr);
        fill(slot, p, 7);
        ring.own[size_t(p)]->commit(slot, 7);
        CHECK(ring.held[0].held() == std::vector<int64_t>{6});
      }
    }
}

TEST_CASE("buddies: a rank started anew receives its state from its buddy, a damaged copy is refused",
          "[buddy]") {
  for (bool shared : {false, true})
    for (bool corrupt : {false, true}) {
      INFO((corrupt ? "copies damaged in memory" : "copies whole") << (shared ? ", segments mapped" : ""));
      Ring ring(2, 1, shared);
      std::vector<int64_t> confirmed(2, -1);
      ring.exchange(0, 3, corrupt, &confirmed);
      CHECK(confirmed[0] == 2);  // checked before the damage: confirmed all the same
      // Rank 1 dies and is started anew: nothing of its own (its segment unmapped and closed as
      // its process would leave it). Rank 0 holds its copy of step 2: in shared memory, the pages
      // rank 0 still maps.
      ring.own[1] = std::make_unique<MemorySnapshots>();
      std::string errors[2];
      std::thread ts[2];
      for (int r = 0; r < 2; ++r)
        ts[r] = std::thread([&, r] {
          try {
            auto l = ring.link(r);
            l->heal(/*receive=*/r == 1, /*send=*/r == 0, 2, 1 << 20, *ring.own[size_t(r)]);
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
        CHECK(ring.own[1]->find(2) == nullptr);  // nothing restored
      } else {
        CHECK(errors[1] == "");
        const RankState* s = ring.own[1]->find(2);
        REQUIRE(s != nullptr);
        CHECK(same_as(*s, 1, 2));
      }
    }
}

TEST_CASE("buddies: a hostile copy header is refused before anything is allocated", "[buddy][hostile]") {
  RankState s;
  fill(s, 3, 9);
  const std::string good = buddy_wire::encode_header(s, 77);
  RankState in;
  const buddy_wire::Header h = buddy_wire::decode_header(good, int64_t(1) << 20, &in);
  CHECK(h.step == 9);
  CHECK(h.where == 0);
  CHECK(in.next_step == -1);  // marked empty until its bytes are checked
  CHECK(in.checksum == 77);
  CHECK(in.rank == 3);
  CHECK(h.sizes == std::vector<size_t>{103, 0, 7});
  CHECK(in.tensors.empty());  // nothing laid out yet
  // Every truncation, a bad magic, a size past the limit, trailing bytes.
  for (size_t n = 0; n < good.size(); ++n)
    CHECK_THROWS_AS(buddy_wire::decode_header(good.substr(0, n), 1 << 20, &in), Error);
  std::string bad = good;
  bad[0] ^= 1;
  CHECK_THROWS_WITH(buddy_wire::decode_header(bad, 1 << 20, &in), Catch::Contains("not a snapshot header"));
  CHECK_THROWS_WITH(buddy_wire::decode_header(good, 100, &in), Catch::Contains("bytes of tensors"));
  CHECK_THROWS_WITH(buddy_wire::decode_header(good + "x", 1 << 20, &in), Catch::Contains("after the header"));
  std::string where = buddy_wire::encode_header(s, 77, 3);  // no slot 2 in a segment
  CHECK_THROWS_WITH(buddy_wire::decode_header(where, 1 << 20, &in), Catch::Contains("malformed header"));
  RankState huge;
  fill(huge, 3, 9);
  huge.shape({1});
  std::string hb = buddy_wire::encode_header(huge, 0);
  // The one size, rewritten to 2^62 floats.
  const uint64_t big = uint64_t(1) << 62;
  std::memcpy(&hb[hb.size() - 8], &big, 8);
  CHECK_THROWS_WITH(buddy_wire::decode_header(hb, int64_t(1) << 40, &in),
                    Catch::Contains("bytes of tensors"));
}

TEST_CASE("buddies: a segment is mapped only as announced, sealed, and never past its slots",
          "[buddy][hostile]") {
  std::string why;
  auto seg = SnapshotSegment::create(10000, &why);
  REQUIRE(seg != nullptr);
  CHECK(seg->slot_bytes() >= 10000);
  const int64_t pid = ::getpid();
  // As announced: mapped, read-only, the same pages.
  auto view = SnapshotSegment::map_peer(pid, seg->fd(), seg->bytes(), seg->token(), &why);
  REQUIRE(view != nullptr);
  CHECK(!view->owned());
  seg->slot(1)[3] = 42.0f;
  seg->set_step(1, 12);
  CHECK(view->slot(1)[3] == 42.0f);
  CHECK(view->step(1) == 12);
  view->set_step(1, 99);  // a mapper cannot move the owner's step
  CHECK(seg->step(1) == 12);
  // Another token, another size, a descriptor that is not there, nonsense: refused by name.
  CHECK(SnapshotSegment::map_peer(pid, seg->fd(), seg->bytes(), seg->token() ^ 1, &why) == nullptr);
  CHECK(why.find("token") != std::string::npos);
  CHECK(SnapshotSegment::map_peer(pid, seg->fd(), seg->bytes() + 8192, seg->token(), &why) == nullptr);
  CHECK(why.find("not a sealed segment") != std::string::npos);
  CHECK(SnapshotSegment::map_peer(pid, 1 << 19, seg->bytes(), seg->token(), &why) == nullptr);
  CHECK(SnapshotSegment::map_peer(-3, seg->fd(), seg->bytes(), seg->token(), &why) == nullptr);
  CHECK(why.find("malformed") != std::string::npos);
  CHECK(SnapshotSegment::map_peer(pid, seg->fd(), 12345, seg->token(), &why) == nullptr);
  // A memfd of the right size whose owner could still shrink it under the mapping (a read past
  // its end would be SIGBUS): refused.
  const int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, off_t(seg->bytes())) == 0);
  CHECK(SnapshotSegment::map_peer(pid, fd, seg->bytes(), seg->token(), &why) == nullptr);
  CHECK(why.find("not a sealed segment") != std::string::npos);
  ::close(fd);
  // A FIFO without a writer (opening it to read would block): refused, at once.
  const std::string fifo =
      std::filesystem::temp_directory_path().string() + "/troupe-test-fifo-" + std::to_string(pid);
  ::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int ff = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(ff >= 0);
  CHECK(SnapshotSegment::map_peer(pid, ff, seg->bytes(), seg->token(), &why) == nullptr);
  CHECK(why.find("not a sealed segment") != std::string::npos);
  ::close(ff);
  ::unlink(fifo.c_str());
  // Read-only to any later open; the owner's own descriptor writes.
  struct stat st {};
  REQUIRE(::fstat(int(seg->fd()), &st) == 0);
  CHECK((st.st_mode & 0777) == 0400);
  // The pages outlive their owner while mapped.
  seg.reset();
  CHECK(view->slot(1)[3] == 42.0f);
  CHECK(view->step(1) == 12);
  // A state too large for a slot is laid out in a block of its own, and a view of it refused.
  RankState big;
  big.place(view, 0);
  CHECK_FALSE(big.attach(view, 0, {view->slot_bytes() / sizeof(float) + 1}));
  CHECK_FALSE(big.attach(view, 2, {4}));
  CHECK(big.attach(view, 1, {4, 4}));
}

TEST_CASE("snapshots: a state copied and hashed in one pass has the checksum of the state it made",
          "[buddy]") {
  // Tensors longer than one hashing piece, one not a multiple of it, one empty.
  const std::vector<size_t> sizes = {200000, 0, 65536 + 17, 3};
  std::vector<std::vector<float>> src;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.emplace_back(sizes[i]);
    for (size_t j = 0; j < sizes[i]; ++j) src[i][j] = float(i) * 0.25f + float(j % 1013) * 1e-3f;
  }
  std::vector<const float*> from;
  for (const auto& v : src) from.push_back(v.data());
  for (bool shared : {false, true}) {
    INFO((shared ? "in a segment" : "in private memory"));
    MemorySnapshots own;
    std::string why;
    if (shared) own.share(SnapshotSegment::create(4 << 20, &why));
    RankState& s = own.begin();
    s.fingerprint = "one pass";
    s.rank = 5;
    s.loss_scale.scale = 8.0;
    s.shape(sizes);
    CHECK((s.segment() != nullptr) == shared);
    const uint64_t sum = copy_into(s, from, 41);
    own.commit(s, 41);
    CHECK(sum == state_checksum(s));
    CHECK(values(s) == src);
    s.tensors[3][1] += 1.0f;
    CHECK(sum != state_checksum(s));
  }
}

TEST_CASE("snapshots: a state moved leaves the old one empty, its views with the new one", "[buddy]") {
  for (bool shared : {false, true}) {
    INFO((shared ? "in a segment" : "in private memory"));
    std::string why;
    auto seg = shared ? SnapshotSegment::create(1 << 16, &why) : nullptr;
    RankState a;
    a.place(seg, 0);
    fill(a, 2, 7);
    CHECK((a.segment() != nullptr) == shared);
    RankState b = std::move(a);
    CHECK(same_as(b, 2, 7));
    CHECK(a.tensors.empty());
    CHECK(a.segment() == nullptr);
    CHECK(a.next_step == -1);
    CHECK_FALSE(a.stale());
    a.set_step(-1);  // nothing of b's slot changes
    CHECK(a.bytes() == 0);
    RankState c;
    c = std::move(b);
    CHECK(same_as(c, 2, 7));
    CHECK(b.tensors.empty());
  }
}
