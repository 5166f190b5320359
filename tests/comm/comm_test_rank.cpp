// One rank of a multi-process comm test, started by test_comm:
//   comm_test_rank <scenario> <store dir> <rank> <size> [timeout ms]
// Exit status: 0 passed; 1 a check failed (stderr says which); 2 bad usage;
// 10 + CommErrc for a CommError (the test asserts on the name).
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "comm/communicator.hpp"
#include "comm_checks.hpp"

using namespace troupe::comm;

namespace {

// "<scenario>-tcp" runs <scenario> with the same-host shared-memory path off.
int run(std::string scenario, const std::string& dir, int rank, int size, std::chrono::milliseconds timeout) {
  CommConfig cfg;
  const std::string tcp_suffix = "-tcp";
  if (scenario.size() > tcp_suffix.size() &&
      scenario.compare(scenario.size() - tcp_suffix.size(), tcp_suffix.size(), tcp_suffix) == 0) {
    cfg.shm = false;
    scenario.resize(scenario.size() - tcp_suffix.size());
  }
  cfg.backend = "gloo";
  cfg.rank = rank;
  cfg.size = size;
  cfg.job = scenario + (cfg.shm ? "" : "-tcp");
  cfg.timeout = std::chrono::milliseconds(30000);
  cfg.store = std::make_shared<FileStore>(dir);
  auto c = make_communicator(cfg);
  if (scenario == "ops") {
    testing::check_all_ops(*c);
  } else if (scenario == "grid") {
    testing::check_grid(*c, 2, 2, 2);
  } else if (scenario == "kill") {
    // Allreduce until a peer is killed (only an error ends the loop, however fast the
    // machine); the first completed one announces that this rank is in the loop.
    Options opt;
    opt.timeout = timeout;
    std::vector<float> x(1 << 18, 1.f);
    for (int64_t it = 0;; ++it) {
      c->allreduce(x.data(), x.size(), ReduceOp::avg, opt);
      if (it == 0) std::ofstream(dir + "/ready." + std::to_string(rank)) << "1";
    }
  } else if (scenario == "silent") {
    // Large broadcasts from the last rank (each one payload, received whole by one wait)
    // until "abort.<rank>" appears in the store dir, then abort from another thread: the test
    // stops the root first, which goes silent mid-message as behind a cut link. Only the
    // abort may end the loop.
    Options opt;
    opt.timeout = timeout;
    std::vector<float> x(size_t(1) << 24, 1.f);
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      const std::string flag = dir + "/abort." + std::to_string(rank);
      while (!done && !std::filesystem::exists(flag))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!done) c->abort();
    });
    try {
      for (int64_t it = 0;; ++it) {
        c->broadcast(x.data(), x.size(), size - 1, opt);
        if (it == 0) std::ofstream(dir + "/ready." + std::to_string(rank)) << "1";
      }
    } catch (...) {
      done = true;
      watcher.join();
      throw;
    }
  } else {
    std::cerr << "unknown scenario " << scenario << "\n";
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: comm_test_rank <scenario> <store dir> <rank> <size> [timeout ms]\n";
    return 2;
  }
  const std::chrono::milliseconds timeout(argc > 5 ? std::stoi(argv[5]) : 30000);
  try {
    return run(argv[1], argv[2], std::stoi(argv[3]), std::stoi(argv[4]), timeout);
  } catch (const CommError& e) {
    std::cerr << "rank " << argv[3] << ": CommError " << e.what() << "\n";
    return 10 + static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << "rank " << argv[3] << ": " << e.what() << "\n";
    return 1;
  }
}
