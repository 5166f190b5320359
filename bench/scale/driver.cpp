#include "bench/scale/driver.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "actors/secret.hpp"
#include "bench/scale/driver_impl.hpp"

namespace troupe::scale {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

std::string Driver::spec() const {
  std::ostringstream s;
  s << "name: scale-" << o_.ranks << "\n"
    << "model:\n  type: gpt\n  vocab_size: 256\n  seq_len: 16\n  d_model: 64\n  n_layers: 4\n  n_heads: 8\n"
    << "data:\n  source: synthetic\n"
    << "train:\n  steps: 100000000\n  global_batch: " << dp_ * pp_ * 2 << "\n  micro_batch: 1\n  seed: 0\n"
    << "parallel:\n  data: " << dp_ << "\n  pipeline: " << pp_ << "\n  tensor: " << tp_ << "\n"
    << "checkpoint:\n  every: " << o_.ckpt_every << "\n  keep: 2\n"
    << "fault:\n  max_restarts: 100\n";
  return s.str();
}

bool Driver::start_coordinator() {
  coordinator_ = std::make_unique<Child>(
      std::vector<std::string>{o_.troupe_binary, "coordinator", "--listen", "127.0.0.1:0", "--api",
                               "tcp://127.0.0.1:0", "--runs-dir", dir_ + "/runs", "--state-dir",
                               dir_ + "/state", "--http", "127.0.0.1:0", "--ready-file", dir_ + "/ready.json",
                               "--secret-file", secret_},
      dir_ + "/coordinator.log", false, o_.coordinator_nice);
  for (int i = 0; i < 3000 && !std::filesystem::exists(dir_ + "/ready.json"); ++i) {
    if (coordinator_->wait(0) >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!std::filesystem::exists(dir_ + "/ready.json")) return false;
  ready_ = json::parse(read_all(dir_ + "/ready.json"), nullptr, false);
  return ready_.is_object();
}

void Driver::start_sims() {
  const int procs = (agents_ + o_.agents_per_proc - 1) / o_.agents_per_proc;
  const int threads = std::max(1, o_.connects / procs);
  for (int p = 0; p < procs; ++p) {
    const int first = p * o_.agents_per_proc, count = std::min(o_.agents_per_proc, agents_ - first);
    // clang-format off
    std::vector<std::string> argv = {
        o_.self_exe, "sim",
        "--coordinator", ready_.value("listen", ""), "--secret-file", secret_,
        "--index", std::to_string(p), "--first-agent", std::to_string(first), "--agents", std::to_string(count),
        "--devices", std::to_string(o_.per_agent), "--step-ms", std::to_string(o_.step_ms),
        "--checkpoint-every", std::to_string(o_.ckpt_every), "--gloo-max", std::to_string(o_.gloo_max),
        "--launch-threads", std::to_string(threads), "--reap-ms", std::to_string(o_.reap_ms),
        "--io-nice", std::to_string(o_.io_nice),
        "--tick-offset-ms", std::to_string(int64_t{o_.step_ms} * p / procs)};
    // clang-format on
    if (!o_.relay) argv.push_back("--no-relay");
    if (o_.inline_workers) argv.push_back("--workers-inline");
    sims_.push_back(std::make_unique<Child>(argv, dir_ + "/sim-" + std::to_string(p) + ".log", true));
  }
  reader_ = std::thread([this] { read_sims(); });
}

void Driver::read_sims() {
  std::vector<std::string> buf(sims_.size());
  std::vector<bool> closed(sims_.size(), false);
  while (!stop_reader_) {
    std::vector<pollfd> fds;
    for (size_t i = 0; i < sims_.size(); ++i) fds.push_back({closed[i] ? -1 : sims_[i]->out_fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char chunk[65536];
      const ssize_t n = ::read(fds[i].fd, chunk, sizeof chunk);
      if (n <= 0) {
        // A simulated process that ended: its waiters learn at once.
        closed[i] = true;
        const int code = stop_reader_ ? 0 : sims_[i]->wait(2000);
        std::lock_guard<std::mutex> lock(obs_.mu);
        if (!stop_reader_)
          obs_.problems.push_back(
              "simulated process " + std::to_string(i) + " ended (" +
              (code > 128 ? "signal " + std::to_string(code - 128) : "exit " + std::to_string(code)) + ")");
        ++obs_.ended_sims;
        obs_.cv.notify_all();
        continue;
      }
      buf[i].append(chunk, static_cast<size_t>(n));
      size_t at = 0;
      std::lock_guard<std::mutex> lock(obs_.mu);
      for (size_t nl; (nl = buf[i].find('\n', at)) != std::string::npos; at = nl + 1)
        obs_.take_sim_line(static_cast<int>(i), buf[i].substr(at, nl - at));
      buf[i].erase(0, at);
      obs_.cv.notify_all();
    }
  }
}

int Driver::run() {
  if (o_.ranks < 2 || o_.per_agent < 1 || o_.ranks % o_.per_agent != 0) {
    std::cerr << "scale: --ranks must be a multiple of --per-agent (" << o_.per_agent << ") and at least 2\n";
    return 2;
  }
  agents_ = o_.ranks / o_.per_agent;
  tp_ = o_.tp > 0 ? o_.tp : std::min(o_.per_agent, 8);
  pp_ = o_.pp > 0 ? o_.pp : (o_.ranks >= 2 * tp_ ? 2 : 1);
  if (o_.ranks % (tp_ * pp_) != 0 || 8 % tp_ != 0 || pp_ > 4) {
    std::cerr
        << "scale: the layout needs ranks divisible by pipeline x tensor, tensor dividing 8, pipeline <= 4\n";
    return 2;
  }
  dp_ = o_.ranks / (tp_ * pp_);
  if (o_.dir.empty()) {
    char tmpl[] = "/tmp/troupe-scale-XXXXXX";
    dir_ = mkdtemp(tmpl);
  } else {
    dir_ = o_.dir;
    std::filesystem::create_directories(dir_);
  }
  secret_ = dir_ + "/secret.pem";
  actors::write_secret(secret_);
  token_ = actors::api_token(secret_);
  results_ = {{"ranks", o_.ranks},
              {"agents", agents_},
              {"per_agent", o_.per_agent},
              {"layout", std::to_string(dp_) + "x" + std::to_string(pp_) + "x" + std::to_string(tp_)},
              {"step_ms", o_.step_ms},
              {"reap_ms", o_.reap_ms},
              {"gloo_max", o_.gloo_max},
              {"workers", o_.inline_workers ? "inline"
                          : o_.relay        ? "relayed"
                                            : "direct"},
              {"phases", json::array()},
              {"checks", json::array()}};
  if (!start_coordinator()) {
    std::cerr << "scale: the coordinator did not start (see " << dir_ << "/coordinator.log)\n";
    return 1;
  }
  feed_ = std::make_unique<EventFeed>(ready_.value("pub", ""), token_, [this](const json& e, int64_t t) {
    std::lock_guard<std::mutex> lock(obs_.mu);
    obs_.take_event(e, t);
    obs_.cv.notify_all();
  });
  phase_t_ = now_ns();
  phase_cpu_ = cpu();
  const int64_t t0 = now_ns();
  start_sims();
  results_["sim_processes"] = sims_.size();

  // ---- agents register
  const bool registered =
      wait(60 + 0.2 * agents_,
           [&] { return int(obs_.registered.size()) >= agents_ || obs_.ended_sims > 0; }) &&
      obs_.ended_sims == 0;
  check("every agent registered", registered,
        std::to_string(obs_.registered.size()) + " of " + std::to_string(agents_));
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    int64_t last = 0;
    for (const auto& [a, t] : obs_.registered) last = std::max(last, t);
    results_["register_s"] = seconds(t0, last);
  }
  phase("register");
  if (!registered) return 1;

  // ---- submit: placed at once, every launch sent
  const int64_t t_submit = now_ns();
  json sub = api({{"op", "submit"}, {"spec", spec()}});
  results_["submit_reply_ms"] = (now_ns() - t_submit) / 1e6;
  check("the job was placed at once", sub.value("ok", false) && sub.value("state", "") == "launching",
        sub.dump().substr(0, 300));
  job_ = sub.value("job", "");
  if (job_.empty()) return 1;
  if (!launch_phase(0, t_submit, "launch")) return 1;
  phase("launch");
  steady_phase();
  phase("steady");
  queries();
  phase("queries");
  if (o_.faults) {
    kill_phase();
    phase("kill");
    hang_phase();
    phase("hang");
    agent_phase();
    phase("agent");
  }
  return failed_ == 0 ? 0 : 1;
}

Driver::~Driver() {
  for (auto& s : sims_) s->send_line("quit");
  for (auto& s : sims_) s->close_stdin();
  for (auto& s : sims_)
    if (s->wait(30000) < 0) std::cerr << "scale: a simulated process did not stop; killed\n";
  if (coordinator_) {
    ::kill(coordinator_->pid(), SIGTERM);
    if (coordinator_->wait(30000) < 0) std::cerr << "scale: the coordinator did not stop; killed\n";
  }
  stop_reader_ = true;
  if (reader_.joinable()) reader_.join();
  feed_.reset();
  sims_.clear();
  if (o_.dir.empty() && !dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

void Driver::report() {
  results_["failed_checks"] = failed_;
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    results_["problems"] = obs_.problems;
    results_["agent_connect_retries"] = obs_.connect_retries;
  }
  print_table();
  if (!o_.json_out.empty()) std::ofstream(o_.json_out) << results_.dump(2) << "\n";
}

int run_driver(const DriverOptions& o) {
  Driver d(o);
  int rc = 2;
  try {
    rc = d.run();
  } catch (const std::exception& e) {
    std::cerr << "scale: " << e.what() << "\n";
    rc = 1;
  }
  if (rc != 2) d.report();
  return rc;
}

}  // namespace troupe::scale
