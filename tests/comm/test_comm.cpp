// The data plane: store, grid groups, and every Communicator operation over
// the local backend (threads), gloo (threads and separate processes) and NCCL
// (when a GPU is present). Multi-process tests start comm_test_rank once per
// rank and assert on its exit status; every wait is bounded and every child is
// reaped (and killed if still running) before a test returns.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "comm/communicator.hpp"
#include "comm/groups.hpp"
#include "comm/store.hpp"
#include "comm_checks.hpp"
#if TROUPE_HAVE_NCCL
#include <cuda_runtime.h>

#include "comm/nccl/nccl_comm.hpp"
#endif

using namespace troupe::comm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/troupe_comm_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// Runs fn(rank) on n threads; returns one message per failed rank ("" = ok).
std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

void require_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

// Child processes of one test. The destructor kills and reaps whatever still
// runs, so a failed assertion never leaves orphans.
class Ranks {
 public:
  Ranks(const std::string& scenario, int n, const std::string& store_dir, int timeout_ms = 30000) {
    for (int r = 0; r < n; ++r) {
      const std::vector<std::string> args{COMM_TEST_RANK,    scenario,          store_dir,
                                          std::to_string(r), std::to_string(n), std::to_string(timeout_ms)};
      const pid_t pid = ::fork();
      if (pid == 0) {
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      REQUIRE(pid > 0);
      pids_.push_back(pid);
    }
    status_.assign(n, -1);
  }
  ~Ranks() {
    for (size_t r = 0; r < pids_.size(); ++r) kill_rank(static_cast<int>(r));
  }

  void signal(int r, int sig) {
    if (status_[r] == -1) ::kill(pids_[r], sig);
  }

  void kill_rank(int r) {
    if (status_[r] != -1) return;
    ::kill(pids_[r], SIGKILL);
    int st = 0;
    ::waitpid(pids_[r], &st, 0);
    status_[r] = decode(st);
  }

  // Exit status of rank r (128 + signal when killed), or -1 if it did not end
  // before the deadline (it is then killed).
  int wait(int r, std::chrono::steady_clock::time_point deadline) {
    while (status_[r] == -1) {
      int st = 0;
      const pid_t p = ::waitpid(pids_[r], &st, WNOHANG);
      if (p == pids_[r]) {
        status_[r] = decode(st);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill_rank(r);
        return -1;
      }
      std::this_thread::sleep_for(5ms);
    }
    return status_[r];
  }

  std::vector<int> wait_all(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<int> out;
    for (size_t r = 0; r < pids_.size(); ++r) out.push_back(wait(static_cast<int>(r), deadline));
    return out;
  }

 private:
  static int decode(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }
  std::vector<pid_t> pids_;
  std::vector<int> status_;
};

constexpr int exit_code(CommErrc c) { return 10 + static_cast<int>(c); }

std::shared_ptr<LocalWorld> g_unused;

std::vector<std::unique_ptr<Communicator>> make_group(const std::string& backend, int n,
                                                      const std::string& job, bool shm = true,
                                                      std::chrono::milliseconds timeout = 10s) {
  auto store = std::make_shared<MemoryStore>();
  auto world = backend == "local" ? make_local_world(n) : nullptr;
  std::vector<std::unique_ptr<Communicator>> comms(n);
  auto errors = run_threads(n, [&](int r) {
    CommConfig cfg;
    cfg.backend = backend;
    cfg.rank = r;
    cfg.size = n;
    cfg.job = job;
    cfg.timeout = timeout;
    cfg.store = store;
    cfg.local_world = world;
    cfg.shm = shm;
    comms[r] = make_communicator(cfg);
  });
  require_no_errors(errors);
  for (auto& c : comms) REQUIRE(c);
  return comms;
}

// Runs op on rank 0 in a thread, aborts rank 0 from this thread, and returns
// the error code op ended with.
CommErrc abort_while_blocked(Communicator& c, const std::function<void()>& op) {
  std::atomic<int> code{-1};
  std::thread t([&] {
    try {
      op();
      code = 100;
    } catch (const CommError& e) {
      code = static_cast<int>(e.code());
    }
  });
  std::this_thread::sleep_for(200ms);
  c.abort();
  t.join();
  REQUIRE(code != 100);
  REQUIRE(code >= 0);
  return static_cast<CommErrc>(code.load());
}

}  // namespace

// ---------------------------------------------------------------- store

TEST_CASE("store: memory store set/get/wait/add and a named timeout", "[store]") {
  MemoryStore s;
  s.set("a", std::string("x\0y", 3));
  CHECK(s.get("a", 10ms) == std::string("x\0y", 3));
  CHECK(s.add("n", 2) == 2);
  CHECK(s.add("n", 3) == 5);
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    s.set("late", "v");
  });
  CHECK(s.get("late", 5s) == "v");
  t.join();
  try {
    s.wait({"a", "missing"}, 20ms);
    FAIL("wait returned without the key");
  } catch (const CommError& e) {
    CHECK(e.code() == CommErrc::timed_out);
    CHECK(std::string(e.what()).find("missing") != std::string::npos);
  }
}

TEST_CASE("store: file store shares keys across instances, prefixes isolate generations", "[store]") {
  TempDir dir;
  auto a = std::make_shared<FileStore>(dir.path);
  FileStore b(dir.path);
  a->set("job/g0/world/0", "addr0");
  CHECK(b.get("job/g0/world/0", 1s) == "addr0");
  b.wait({"job/g0/world/0"}, 1s);
  CHECK(a->add("ctr", 4) == 4);
  CHECK(b.add("ctr", -1) == 3);

  PrefixStore g0(store_prefix("job", 0, "world"), a), g1(store_prefix("job", 1, "world"), a);
  CHECK(g0.get("0", 1s) == "addr0");
  g1.set("0", "addr-new");
  CHECK(g0.get("0", 1s) == "addr0");
  CHECK(g1.get("0", 1s) == "addr-new");
  CHECK_THROWS_AS(g1.get("1", 20ms), CommError);
}

// ---------------------------------------------------------------- groups

TEST_CASE("groups: 2x2x2 grid, tensor innermost", "[groups]") {
  const GridGroups g = grid_groups(2, 2, 2);
  CHECK(g.tensor == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(g.pipeline == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(g.data == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  const GridCoord c = grid_coord(6, 2, 2, 2);
  CHECK((c.d == 1 && c.p == 1 && c.t == 0));
  CHECK(group_of(g.data, 5) == std::vector<int>{1, 5});
  CHECK(group_name("dp", g.data, 5) == "dp1");
  const GridGroups h = grid_groups(1, 3, 2);
  CHECK(h.pipeline == std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}});
  CHECK(h.data.size() == 6);
  CHECK_THROWS_AS(grid_groups(0, 1, 1), CommError);
}

// ---------------------------------------------------------------- local

TEST_CASE("local: every op for world sizes 1-4, counts 0/1/7/1Mi, sum and average", "[local]") {
  for (int n = 1; n <= 4; ++n) {
    INFO("world size " << n);
    auto comms = make_group("local", n, "ops");
    require_no_errors(run_threads(n, [&](int r) { testing::check_all_ops(*comms[r]); }));
  }
}

TEST_CASE("local: 2x2x2 grid groups", "[local]") {
  auto comms = make_group("local", 8, "grid");
  require_no_errors(run_threads(8, [&](int r) { testing::check_grid(*comms[r], 2, 2, 2); }));
}

TEST_CASE("local: a timeout is a named error, fails the peers and poisons", "[local]") {
  auto comms = make_group("local", 3, "timeout");
  std::vector<int> codes(3, -1);
  run_threads(3, [&](int r) {
    if (r == 2) return;  // never joins
    Options opt;
    opt.timeout = r == 0 ? 50ms : 10s;
    float x = 1.f;
    try {
      comms[r]->allreduce(&x, 1, ReduceOp::sum, opt);
    } catch (const CommError& e) {
      codes[r] = static_cast<int>(e.code());
    }
  });
  CHECK(codes[0] == static_cast<int>(CommErrc::timed_out));
  CHECK(codes[1] == static_cast<int>(CommErrc::peer_lost));
  CHECK(comms[0]->poisoned());
  float x = 0.f;
  try {
    comms[0]->allreduce(&x, 1, ReduceOp::sum);
    FAIL("a poisoned communicator ran an op");
  } catch (const CommError& e) {
    CHECK(e.code() == CommErrc::timed_out);
    CHECK(std::string(e.what()).find("poisoned") != std::string::npos);
  }
}

TEST_CASE("local: abort from another thread unblocks recv and allreduce", "[local][abort]") {
  auto comms = make_group("local", 2, "abort");
  std::vector<float> buf(16);
  CHECK(abort_while_blocked(*comms[0], [&] { comms[0]->recv(buf.data(), 64, 1, 3, Options{20s}); }) ==
        CommErrc::aborted);
  auto again = make_group("local", 2, "abort2");
  CHECK(abort_while_blocked(*again[0], [&] {
          again[0]->allreduce(buf.data(), 16, ReduceOp::sum, Options{20s});
        }) == CommErrc::aborted);
  // The peer learns that the group is gone.
  try {
    again[1]->allreduce(buf.data(), 16, ReduceOp::sum, Options{20s});
    FAIL("peer of an aborted rank completed an allreduce");
  } catch (const CommError& e) {
    CHECK(e.code() == CommErrc::peer_lost);
  }
}

TEST_CASE("local and gloo: invalid arguments are named errors", "[local][gloo]") {
  for (const char* backend : {"local", "gloo"}) {
    INFO(backend);
    auto comms = make_group(backend, 2, "invalid");
    float x = 0.f;
    try {
      comms[0]->broadcast(&x, 1, 2);
      FAIL("broadcast from rank 2 of 2");
    } catch (const CommError& e) {
      CHECK(e.code() == CommErrc::invalid_argument);
      CHECK(std::string(e.what()).find("broadcast") != std::string::npos);
    }
    try {
      comms[1]->send(&x, 4, 1, 0);
      FAIL("send to self");
    } catch (const CommError& e) {
      CHECK(e.code() == CommErrc::invalid_argument);
    }
  }
  CommConfig cfg;
  cfg.backend = "carrier-pigeon";
  CHECK_THROWS_AS(make_communicator(cfg), CommError);
}

TEST_CASE("local and gloo: 16-bit sums accumulate in f32 and round once, except gloo TCP per hop",
          "[local][gloo][dtype]") {
  // 256 + 1 + 1 + 1 = 259: one rounding to bf16 (spacing 2 above 256, tie to even) gives
  // 260. Rounding after every addition loses each 1 (256 + 1 = 257 ties down to 256).
  struct Case {
    const char* backend;
    bool shm;
  };
  for (const Case& k : {Case{"local", true}, Case{"gloo", true}, Case{"gloo", false}}) {
    INFO(k.backend << (k.shm ? "" : " TCP"));
    auto comms = make_group(k.backend, 4, std::string("acc-") + (k.shm ? "shm" : "tcp"), k.shm);
    std::vector<uint16_t> got(4);
    std::vector<float> got16(4);
    require_no_errors(run_threads(4, [&](int r) {
      std::vector<uint16_t> x(5, troupe::f32_to_bf16(r == 0 ? 256.f : 1.f));
      comms[r]->allreduce(x.data(), x.size(), troupe::DType::bf16, ReduceOp::sum);
      got[r] = x[4];
      // f16 with the same shape one octave up: spacing 2 above 2048 (11-bit mantissa).
      std::vector<uint16_t> h(3, troupe::f32_to_f16(r == 0 ? 2048.f : 1.f));
      comms[r]->allreduce(h.data(), h.size(), troupe::DType::f16, ReduceOp::sum);
      got16[r] = troupe::f16_to_f32(h[2]);
    }));
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(got[r] == got[0]);
      CHECK(got16[r] == got16[0]);
      if (k.shm) {
        CHECK(troupe::bf16_to_f32(got[r]) == 260.f);
        CHECK(got16[r] == 2052.f);
      } else {
        // One rounding per hop of gloo's ring: below the f32 sum, never above it.
        CHECK(troupe::bf16_to_f32(got[r]) >= 256.f);
        CHECK(troupe::bf16_to_f32(got[r]) <= 260.f);
        CHECK(got16[r] >= 2048.f);
        CHECK(got16[r] <= 2052.f);
      }
    }
  }
}

TEST_CASE("local and gloo: u8 moves but cannot be reduced, a named error naming dtype and backend",
          "[local][gloo][dtype]") {
  for (const char* backend : {"local", "gloo"}) {
    INFO(backend);
    auto comms = make_group(backend, 2, "u8");
    std::vector<std::string> what(2);
    require_no_errors(run_threads(2, [&](int r) {
      std::vector<uint8_t> all(6), mine{uint8_t(r), uint8_t(10 + r), uint8_t(250 + r)};
      comms[r]->allgather(mine.data(), all.data(), 3);
      if (all != std::vector<uint8_t>{0, 10, 250, 1, 11, 251}) throw std::runtime_error("u8 allgather");
      try {
        comms[r]->allreduce(mine.data(), 3, ReduceOp::sum);
        what[r] = "allreduce of u8 ran";
      } catch (const CommError& e) {
        if (e.code() != CommErrc::invalid_argument) throw;
        what[r] = e.what();
      }
    }));
    for (int r = 0; r < 2; ++r) {
      INFO(what[r]);
      CHECK(what[r].find("u8") != std::string::npos);
      CHECK(what[r].find(std::string("the ") + backend + " backend") != std::string::npos);
      CHECK(what[r].find("allreduce") != std::string::npos);
    }
    CHECK(comms[0]->poisoned());
  }
}

// ---------------------------------------------------------------- gloo, ranks as threads

TEST_CASE("gloo: abort from another thread unblocks recv and allreduce, the peer gets a named error",
          "[gloo][abort]") {
  for (bool shm : {true, false}) {
    INFO((shm ? "same-host shared-memory collectives" : "TCP collectives"));
    const std::string job = shm ? "abort-shm" : "abort-tcp";
    auto comms = make_group("gloo", 2, job + "-recv", shm);
    std::vector<float> buf(1 << 20);
    std::atomic<int> peer_code{-1};
    std::thread peer([&] {
      std::vector<float> b(16);
      try {
        comms[1]->recv(b.data(), 64, 0, 4, Options{10s});
      } catch (const CommError& e) {
        peer_code = static_cast<int>(e.code());
      }
    });
    CHECK(abort_while_blocked(*comms[0], [&] { comms[0]->recv(buf.data(), 64, 1, 3, Options{20s}); }) ==
          CommErrc::aborted);
    peer.join();
    CHECK((peer_code == static_cast<int>(CommErrc::peer_lost) ||
           peer_code == static_cast<int>(CommErrc::timed_out)));

    auto again = make_group("gloo", 2, job + "-allreduce", shm);
    std::atomic<int> peer2{-1};
    std::thread peer_barrier([&] {
      try {
        // Joins a different collective: never matches rank 0's allreduce.
        std::this_thread::sleep_for(50ms);
        again[1]->barrier(Options{10s});
      } catch (const CommError& e) {
        peer2 = static_cast<int>(e.code());
      }
    });
    CHECK(abort_while_blocked(*again[0], [&] {
            again[0]->allreduce(buf.data(), buf.size(), ReduceOp::sum, Options{20s});
          }) == CommErrc::aborted);
    peer_barrier.join();
    CHECK(again[0]->poisoned());
    if (peer2 != -1)
      CHECK(
          (peer2 == static_cast<int>(CommErrc::peer_lost) || peer2 == static_cast<int>(CommErrc::timed_out)));
  }
}

namespace {
// Counts the requests that reach a memory store.
class CountingStore : public MemoryStore {
 public:
  void set(const std::string& key, const std::string& value) override {
    ++sets;
    MemoryStore::set(key, value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    ++gets;
    return MemoryStore::get(key, timeout);
  }
  std::atomic<int> sets{0}, gets{0};
};
}  // namespace

TEST_CASE("gloo: a communicator of named peers connects those only: point-to-point with them, nothing else",
          "[gloo]") {
  // A ring of 6: each rank connects to its two neighbours (what the snapshot buddies use).
  const int n = 6;
  auto store = std::make_shared<CountingStore>();
  std::vector<std::unique_ptr<Communicator>> comms(n);
  require_no_errors(run_threads(n, [&](int r) {
    CommConfig cfg;
    cfg.rank = r;
    cfg.size = n;
    cfg.job = "peers";
    cfg.timeout = 10s;
    cfg.store = store;
    cfg.peers = std::vector<int>{(r + 1) % n, (r + n - 1) % n};
    comms[r] = make_communicator(cfg);
  }));
  // One address published and one read per pair end: 2 of each per rank, not a full mesh's
  // n - 1 plus every lower rank's host name.
  CHECK(store->sets == 2 * n);
  CHECK(store->gets == 2 * n);
  require_no_errors(run_threads(n, [&](int r) {
    int out = 100 + r, in = -1;
    comms[r]->batch(
        {P2POp::send(&out, sizeof out, (r + 1) % n, 7), P2POp::recv(&in, sizeof in, (r + n - 1) % n, 7)},
        Options{10s});
    if (in != 100 + (r + n - 1) % n) throw std::runtime_error("got " + std::to_string(in));
  }));
  // A collective, or a rank it is not connected to, is a named error, before anything is sent.
  float x = 1;
  try {
    comms[0]->allreduce(&x, 1, ReduceOp::sum, Options{1s});
    FAIL("allreduce over a ring of peers did not throw");
  } catch (const CommError& e) {
    CHECK(e.code() == CommErrc::invalid_argument);
    CHECK(std::string(e.what()).find("connects 2 of its 5 peers") != std::string::npos);
  }
  int y = 0;
  try {
    comms[1]->send(&y, sizeof y, 3, 1, Options{1s});
    FAIL("send to a rank not connected did not throw");
  } catch (const CommError& e) {
    CHECK(e.code() == CommErrc::invalid_argument);
  }
  // Abort reaches a receive in flight from a peer.
  std::vector<int> buf(4);
  CHECK(abort_while_blocked(*comms[3], [&] { comms[3]->recv(buf.data(), 16, 2, 9, Options{20s}); }) ==
        CommErrc::aborted);
}

TEST_CASE("gloo: a rank that never joins makes the others time out, poisoned afterwards", "[gloo]") {
  for (bool shm : {true, false}) {
    INFO((shm ? "same-host shared-memory collectives" : "TCP collectives"));
    auto comms = make_group("gloo", 2, shm ? "timeout-shm" : "timeout-tcp", shm);
    std::vector<float> x(7, 1.f);
    try {
      comms[0]->allreduce(x.data(), x.size(), ReduceOp::sum, Options{200ms});
      FAIL("allreduce completed without its peer");
    } catch (const CommError& e) {
      CHECK(e.code() == CommErrc::timed_out);
      CHECK(std::string(e.what()).find("allreduce") != std::string::npos);
    }
    CHECK(comms[0]->poisoned());
    CHECK_THROWS_AS(comms[0]->barrier(), CommError);
  }
}

// ---------------------------------------------------------------- gloo, ranks as processes

TEST_CASE("gloo processes: every op for world sizes 1-4, counts 0/1/7/1Mi, sum and average", "[gloo][proc]") {
  // "ops": same-host collectives through shared memory; "ops-tcp": through gloo's TCP.
  for (const char* scenario : {"ops", "ops-tcp"}) {
    for (int n = 1; n <= 4; ++n) {
      INFO(scenario << ", world size " << n);
      TempDir dir;
      Ranks ranks(scenario, n, dir.path);
      const auto st = ranks.wait_all(100s);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(st[r] == 0);
      }
    }
  }
}

TEST_CASE("gloo processes: the groups of a 2x2x2 grid", "[gloo][proc]") {
  TempDir dir;
  Ranks ranks("grid", 8, dir.path);
  const auto st = ranks.wait_all(100s);
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(st[r] == 0);
  }
}

TEST_CASE("gloo processes: SIGKILL of one rank mid-allreduce fails every survivor with a named error",
          "[gloo][proc][kill]") {
  for (const char* scenario : {"kill", "kill-tcp"}) {
    INFO(scenario);
    const int n = 4, victim = 2;
    TempDir dir;
    Ranks ranks(scenario, n, dir.path, 3000);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int r = 0; r < n; ++r)
      while (!fs::exists(dir.path + "/ready." + std::to_string(r))) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(5ms);
      }
    ranks.kill_rank(victim);
    const auto st = ranks.wait_all(100s);
    CHECK(st[victim] == 128 + SIGKILL);
    for (int r = 0; r < n; ++r) {
      if (r == victim) continue;
      INFO("survivor " << r << " exit " << st[r]);
      CHECK((st[r] == exit_code(CommErrc::peer_lost) || st[r] == exit_code(CommErrc::timed_out)));
    }
  }
}

TEST_CASE("gloo processes: abort ends a collective whose peer went silent mid-message, as behind a cut link",
          "[gloo][proc][abort]") {
  // Rank 1 is stopped while it broadcasts large payloads to rank 0: rank 0's receive stops
  // part-way through one, with no error on its socket (as when a link is cut and the peer's
  // host is gone), and gloo lists that receive nowhere once its bytes began to arrive. The
  // operation timeout is far beyond this test's bound: only the abort can end it, and it must
  // end with the name "aborted".
  TempDir dir;
  Ranks ranks("silent-tcp", 2, dir.path, 600000);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (int r = 0; r < 2; ++r)
    while (!fs::exists(dir.path + "/ready." + std::to_string(r))) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(5ms);
    }
  ranks.signal(1, SIGSTOP);
  std::this_thread::sleep_for(100ms);  // whatever was in flight drains into the sockets
  std::ofstream(dir.path + "/abort.0") << "1";
  const int st = ranks.wait(0, std::chrono::steady_clock::now() + 60s);
  ranks.signal(1, SIGCONT);
  CHECK(st == exit_code(CommErrc::aborted));
}

// ---------------------------------------------------------------- nccl

TEST_CASE("nccl: allreduce and abort on GPUs", "[gpu]") {
#if TROUPE_HAVE_NCCL
  const int devices = nccl_device_count();
  if (devices == 0) {
    if (std::getenv("TROUPE_REQUIRE_GPU") != nullptr) FAIL("no CUDA device visible (cudaGetDeviceCount)");
    WARN("no CUDA device visible (cudaGetDeviceCount): NCCL test skipped");
    SUCCEED();
    return;
  }
  const int n = std::min(devices, 4);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<Communicator>> comms(n);
  require_no_errors(run_threads(n, [&](int r) {
    CommConfig cfg;
    cfg.backend = "nccl";
    cfg.rank = r;
    cfg.size = n;
    cfg.device = r;
    cfg.store = store;
    cfg.job = "nccl";
    comms[r] = make_communicator(cfg);
  }));
  const size_t count = 1 << 20;
  require_no_errors(run_threads(n, [&](int r) {
    cudaSetDevice(r);
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = testing::value(r, i);
    float* dev = nullptr;
    if (cudaMalloc(&dev, count * 4) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemcpy(dev, host.data(), count * 4, cudaMemcpyHostToDevice);
    comms[r]->allreduce(dev, count, ReduceOp::sum);
    cudaMemcpy(host.data(), dev, count * 4, cudaMemcpyDeviceToHost);
    cudaFree(dev);
    const float s = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i)
      COMM_EXPECT(host[i] == s * static_cast<float>(i % 13 + 1),
                  "nccl allreduce element " + std::to_string(i));
    // bf16 and f16 sums of small integers: exact, so bitwise on every backend (an average
    // too when n is a power of two, whether NCCL divides before or after the sum).
    for (troupe::DType dt : {troupe::DType::bf16, troupe::DType::f16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        if (op == ReduceOp::avg && (n & (n - 1)) != 0) continue;
        auto narrow = [dt](float f) {
          return dt == troupe::DType::bf16 ? troupe::f32_to_bf16(f) : troupe::f32_to_f16(f);
        };
        std::vector<uint16_t> h(count);
        for (size_t i = 0; i < count; ++i) h[i] = narrow(testing::value(r, i));
        uint16_t* d16 = nullptr;
        if (cudaMalloc(&d16, count * 2) != cudaSuccess) throw std::runtime_error("cudaMalloc");
        cudaMemcpy(d16, h.data(), count * 2, cudaMemcpyHostToDevice);
        comms[r]->allreduce(d16, count, dt, op);
        cudaMemcpy(h.data(), d16, count * 2, cudaMemcpyDeviceToHost);
        cudaFree(d16);
        for (size_t i = 0; i < count; ++i) {
          float want = s * static_cast<float>(i % 13 + 1);
          if (op == ReduceOp::avg) want /= static_cast<float>(n);
          COMM_EXPECT(h[i] == narrow(want), std::string("nccl allreduce ") + troupe::dtype_name(dt) + " " +
                                                to_string(op) + " element " + std::to_string(i));
        }
      }
    }
  }));
  if (n < 2) {
    WARN("one CUDA device: multi-rank NCCL abort needs two, skipped");
    return;
  }
  float* dev = nullptr;
  cudaSetDevice(0);
  REQUIRE(cudaMalloc(&dev, 4096) == cudaSuccess);
  CHECK(abort_while_blocked(*comms[0], [&] {
          comms[0]->allreduce(dev, 1024, ReduceOp::sum, Options{20s});
        }) == CommErrc::aborted);
  comms.clear();
  cudaFree(dev);
#else
  WARN("built without CUDA/NCCL: NCCL test skipped");
  SUCCEED();
#endif
}
