// troupe submit | status | list | watch | cancel | scale: clients of the coordinator's ZeroMQ API.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "actors/secret.hpp"
#include "cli/commands.hpp"
#include "coordinator/client.hpp"
#include "coordinator/server.hpp"
#include "core/error.hpp"

namespace troupe::cli {

namespace {

struct ClientFlags {
  std::string api = "tcp://127.0.0.1:5555";
  std::string token_file;
  std::string secret_file;
  bool json = false;
};

void add_flags(CLI::App* cmd, ClientFlags* f) {
  cmd->add_option("--api", f->api, "The coordinator's API endpoint")->capture_default_str();
  cmd->add_option("--secret-file", f->secret_file,
                  "The cluster secret: requests carry the API token derived from it")
      ->envname(actors::kSecretEnv);
  cmd->add_option("--api-token-file", f->token_file,
                  "Token file, when the coordinator was started with --api-token-file");
  cmd->add_flag("--json", f->json, "Print the raw JSON reply");
}

coord::ClientOptions options(const ClientFlags& f) {
  coord::ClientOptions o;
  o.endpoint = f.api;
  if (!f.token_file.empty())
    o.token = coord::read_token_file(f.token_file);
  else if (!f.secret_file.empty())
    o.token = actors::api_token(f.secret_file);
  return o;
}

bool terminal(const std::string& s) { return s == "succeeded" || s == "failed" || s == "cancelled"; }

// Prints a reply; returns the exit code.
int report(const nlohmann::json& r, bool json, const std::function<void(const nlohmann::json&)>& human) {
  if (json) {
    std::cout << r.dump(2) << "\n";
  } else if (r.value("ok", false)) {
    human(r);
  } else {
    std::cerr << "troupe: " << r.value("error", "error") << ": " << r.value("message", "") << "\n";
  }
  if (r.value("ok", false)) return kOk;
  return r.value("error", "") == "invalid_spec" || r.value("error", "") == "bad_request" ? kUsage
                                                                                         : kJobFailed;
}

void print_job(const nlohmann::json& j) {
  std::cout << j.value("id", "") << "  " << j.value("name", "") << "  " << j.value("state", "") << "  layout "
            << j.value("layout", "") << "  steps " << j.value("steps_done", 0) << "/"
            << j.value("total_steps", 0);
  if (j.contains("loss")) std::cout << "  loss " << j["loss"].get<double>();
  std::cout << "\n";
  if (!j.value("reason", "").empty()) std::cout << "  " << j["reason"].get<std::string>() << "\n";
  if (j.contains("run_dir")) std::cout << "  run dir: " << j["run_dir"].get<std::string>() << "\n";
  if (j.contains("workers"))
    for (const auto& w : j["workers"]) {
      std::cout << "  rank " << w["rank"].get<int>() << ": " << w["host"].get<std::string>() << " "
                << w["device"].get<std::string>() << " pid " << w["pid"].get<int>();
      // The rank's grid coordinates and stage layers: the line its worker log prints.
      if (w.contains("place")) std::cout << "  (" << w["place"].get<std::string>() << ")";
      std::cout << "\n";
    }
  // A big job lists one page of its workers: say which, and how to see the next.
  if (j.contains("workers_next")) {
    const int64_t from = j.value("workers_from", int64_t{0}), next = j["workers_next"].get<int64_t>();
    std::cout << "  ranks " << from << "-" << next - 1 << " of " << j.value("workers_total", int64_t{0})
              << " shown (the next: troupe status " << j.value("id", "") << " --workers-from " << next
              << ")\n";
  }
}

}  // namespace

void add_client_commands(CLI::App& app, int* exit_code) {
  {
    auto* cmd = app.add_subcommand("submit", "Submit a job spec to a coordinator; prints the job id");
    static ClientFlags f;
    static std::string file;
    add_flags(cmd, &f);
    cmd->add_option("spec", file, "YAML job spec")->required()->check(CLI::ExistingFile);
    cmd->callback([exit_code] {
      std::ifstream in(file);
      std::stringstream ss;
      ss << in.rdbuf();
      auto r = coord::api_call(options(f), {{"op", "submit"}, {"spec", ss.str()}, {"filename", file}});
      *exit_code = report(r, f.json, [](const nlohmann::json& r) {
        std::cout << r["job"].get<std::string>() << "\n";
        std::cerr << "state " << r.value("state", "") << "; run dir " << r.value("run_dir", "") << "\n";
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("status", "Show one job");
    static ClientFlags f;
    static std::string job;
    static int64_t workers_from = 0, workers_limit = 0;
    add_flags(cmd, &f);
    cmd->add_option("job", job, "Job id")->required();
    cmd->add_option("--workers-from", workers_from, "First rank of the workers listed (default 0)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--workers-limit", workers_limit, "How many workers to list (default 256, at most 4096)")
        ->check(CLI::Range(1, 4096));
    cmd->callback([exit_code] {
      nlohmann::json req = {{"op", "status"}, {"job", job}, {"workers_from", workers_from}};
      if (workers_limit > 0) req["workers_limit"] = workers_limit;
      auto r = coord::api_call(options(f), req);
      *exit_code = report(r, f.json, [](const nlohmann::json& r) { print_job(r["job"]); });
    });
  }
  {
    auto* cmd = app.add_subcommand("list", "List jobs, agents and free devices");
    static ClientFlags f;
    add_flags(cmd, &f);
    cmd->callback([exit_code] {
      auto r = coord::api_call(options(f), {{"op", "list"}});
      *exit_code = report(r, f.json, [](const nlohmann::json& r) {
        for (const auto& j : r["jobs"]) {
          std::cout << j.value("id", "") << "  " << j.value("name", "") << "  " << j.value("state", "")
                    << "  " << j.value("layout", "") << "  " << j.value("steps_done", 0) << "/"
                    << j.value("total_steps", 0);
          if (!j.value("reason", "").empty()) std::cout << "  (" << j["reason"].get<std::string>() << ")";
          std::cout << "\n";
        }
        for (const auto& [kind, d] : r["devices"].items())
          std::cout << kind << ": " << d["free"].get<int>() << " free of " << d["total"].get<int>() << "\n";
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("cancel", "Cancel a job; its workers are stopped");
    static ClientFlags f;
    static std::string job;
    add_flags(cmd, &f);
    cmd->add_option("job", job, "Job id")->required();
    cmd->callback([exit_code] {
      auto r = coord::api_call(options(f), {{"op", "cancel"}, {"job", job}});
      *exit_code = report(r, f.json, [](const nlohmann::json& r) {
        std::cout << r["job"].get<std::string>() << " cancelled\n";
      });
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "scale", "Resize a running job: checkpoint at a step boundary, relaunch with a new data size");
    static ClientFlags f;
    static std::string job;
    static int devices = 0;
    add_flags(cmd, &f);
    cmd->add_option("job", job, "Job id")->required();
    cmd->add_option("--devices", devices, "Devices wanted (a multiple of pipeline x tensor)")->required();
    cmd->callback([exit_code] {
      auto r = coord::api_call(options(f), {{"op", "scale"}, {"job", job}, {"devices", devices}});
      *exit_code = report(r, f.json, [](const nlohmann::json& r) {
        std::cout << r["job"].get<std::string>() << " resizes from " << r["from_layout"].get<std::string>()
                  << " to " << r["devices"].get<int>() << " devices after step "
                  << r["after_step"].get<int64_t>() << "\n";
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("watch", "Follow a job's state changes and steps until it ends");
    static ClientFlags f;
    static std::string job;
    add_flags(cmd, &f);
    cmd->add_option("job", job, "Job id")->required();
    cmd->callback([exit_code] {
      auto o = options(f);
      auto info = coord::api_call(o, {{"op", "info"}});
      if (!info.value("ok", false)) {
        *exit_code = report(info, false, [](const nlohmann::json&) {});
        return;
      }
      auto st = coord::api_call(o, {{"op", "status"}, {"job", job}});
      if (!st.value("ok", false)) {
        *exit_code = report(st, f.json, [](const nlohmann::json&) {});
        return;
      }
      std::string state = st["job"]["state"];
      std::cout << job << " " << state << "\n";
      if (terminal(state)) {
        *exit_code = state == "succeeded" ? kOk : kJobFailed;
        return;
      }
      // Events are not replayed: the status is asked again whenever the stream is quiet.
      while (!terminal(state)) {
        const auto end = coord::watch_events(
            info.value("pub", ""), o.token,
            [&](const nlohmann::json& e) {
              if (e.value("job", "") != job) return true;
              if (f.json) std::cout << e.dump() << std::endl;
              if (e.value("event", "") == "step" && !f.json) {
                const auto& m = e["metrics"];
                std::cout << "step " << m["step"].get<int64_t>() << " loss " << m["loss"].get<double>() << " "
                          << m["tokens_per_s"].get<double>() << " tok/s" << std::endl;
              }
              if (e.value("event", "") == "state") {
                state = e.value("state", "");
                if (!f.json) std::cout << job << " " << state << " " << e.value("reason", "") << std::endl;
              }
              return !terminal(state);
            },
            std::chrono::milliseconds(2000));
        if (end == coord::WatchEnd::refused) {
          std::cerr << "troupe watch: the coordinator's event socket refused the API token (events need the "
                       "same token as requests: --secret-file or --api-token-file)\n";
          *exit_code = kUsage;
          return;
        }
        if (terminal(state)) break;
        auto again = coord::api_call(o, {{"op", "status"}, {"job", job}});
        if (!again.value("ok", false)) break;
        state = again["job"]["state"];
        if (terminal(state) && !f.json)
          std::cout << job << " " << state << " " << again["job"].value("reason", "") << "\n";
      }
      *exit_code = state == "succeeded" ? kOk : kJobFailed;
    });
  }
}

}  // namespace troupe::cli
