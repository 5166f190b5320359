#include "core/run_dir.hpp"

#include <chrono>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.hpp"

namespace fs = std::filesystem;

namespace troupe {

std::string utc_timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, int(ms));
  return out;
}

std::string make_job_id() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  char out[48];
  std::snprintf(out, sizeof out, "%s-%04x", buf, unsigned(rd() & 0xffff));
  return out;
}

RunDir::RunDir(const std::string& root, const std::string& job_name, const std::string& job_id)
    : path_(root + "/" + job_name + "-" + job_id) {
  std::error_code ec;
  fs::create_directories(path_ + "/workers", ec);
  TROUPE_CHECK(!ec, "cannot create run directory ", path_, ": ", ec.message());
  events_.open(path_ + "/events.log", std::ios::app);
  metrics_.open(path_ + "/metrics.jsonl", std::ios::app);
  TROUPE_CHECK(events_ && metrics_, "cannot open the logs in ", path_);
}

std::string RunDir::worker_log(int rank) const { return path_ + "/workers/" + std::to_string(rank) + ".log"; }

void RunDir::write_spec(const std::string& resolved_yaml) {
  std::ofstream f(path_ + "/spec.yaml", std::ios::trunc);
  f << resolved_yaml;
  TROUPE_CHECK(f.good(), "cannot write ", path_, "/spec.yaml");
}

void RunDir::event(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  events_ << utc_timestamp() << " " << message << "\n";
  events_.flush();
}

void RunDir::metrics(const nlohmann::json& line) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ << line.dump() << "\n";
  metrics_.flush();
}

}  // namespace troupe
