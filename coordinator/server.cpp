#include "coordinator/server.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "coordinator/api.hpp"
#include "coordinator/api_server.hpp"
#include "coordinator/coordinator_actor.hpp"
#include "coordinator/dashboard_server.hpp"
#include "coordinator/state.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "plan/hardware.hpp"

namespace troupe::coord {

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  TROUPE_CHECK(in.good(), "cannot read the token file ", path);
  std::string line;
  std::getline(in, line);
  auto b = line.find_first_not_of(" \t\r\n"), e = line.find_last_not_of(" \t\r\n");
  TROUPE_CHECK(b != std::string::npos, "the token file ", path, " is empty");
  return line.substr(b, e - b + 1);
}

int run_coordinator(const CoordinatorOptions& o) {
  // Signals are taken synchronously by this thread (sigtimedwait); every thread
  // started from here on inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  actors::check_secret(o.secret_file);
  // Every API request carries a token, on loopback too (login nodes are shared):
  // the token file's, or the one every holder of the cluster secret can derive.
  const std::string token =
      o.api_token_file.empty() ? actors::api_token(o.secret_file) : read_token_file(o.api_token_file);
  auto [host, port] = actors::parse_host_port(o.listen);

  size_t loaded_jobs = 0;
  if (!o.state_dir.empty()) {
    // A table that does not load stops the start here, with its reason, instead of inside the actor.
    auto table = load_table_file(o.state_dir);
    if (!table.is_null()) {
      CoordinatorState check(o.runs_dir, actors::kProtocolVersion);
      Actions ignored;
      check.load_table(table, &ignored);
      loaded_jobs = check.jobs().size();
    }
  }

  actors::NodeConfig cfg(o.secret_file);
  caf::actor_system sys{cfg};

  std::mutex api_mu;
  ApiServer* api_ptr = nullptr;
  auto feed = std::make_shared<DashboardFeed>();  // the events to --http's dashboard
  CoordinatorActorOptions copt;
  copt.runs_dir = o.runs_dir;
  copt.state_dir = o.state_dir;
  if (!o.hardware.empty()) {
    try {
      copt.default_hardware = plan::to_yaml(plan::load_hardware(o.hardware));
    } catch (const SpecError& e) {
      throw Error(std::string("--hardware: ") + e.what());
    }
  }
  if (o.protocol_override) copt.protocol = o.protocol_override;
  copt.on_event = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(api_mu);
    if (api_ptr) api_ptr->publish(e);
    feed->publish(e);
  };
  auto coord = spawn_coordinator(sys, copt);
  caf::actor_cast<caf::abstract_actor*>(coord)->attach_functor([&sys](const caf::error& reason) {
    if (reason == caf::exit_reason::user_shutdown) return;
    std::cerr << "troupe coordinator: the coordinator actor failed (" << sys.render(reason)
              << "); exiting so that a supervisor can restart it" << std::endl;
    std::_Exit(70);
  });

  auto ask = [&](const std::string& req) {
    caf::scoped_actor self{sys};
    std::string out;
    self->request(coord, std::chrono::seconds(10), actors::api_atom::value, req)
        .receive([&](std::string& r) { out = std::move(r); },
                 [&](caf::error& e) { out = json_text(api_error("internal", sys.render(e))); });
    return out;
  };

  std::unique_ptr<ApiServer> api;
  try {
    ApiOptions aopt;
    aopt.endpoint = o.api;
    aopt.pub_endpoint = o.api_pub;
    aopt.token = token;
    api = std::make_unique<ApiServer>(aopt, ask);
  } catch (const Error& e) {
    std::cerr << "troupe coordinator: " << e.what() << "\n";
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return 2;
  }
  std::unique_ptr<DashboardServer> dash;
  DashboardFeed::DetachOnExit detach_on_exit{*feed};
  if (!o.http.empty()) {
    try {
      dash = std::make_unique<DashboardServer>(DashboardOptions{o.http, token}, ask);
    } catch (const Error& e) {
      std::cerr << "troupe coordinator: " << e.what() << "\n";
      api->stop();
      caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
      return 2;
    }
  }
  {
    std::lock_guard<std::mutex> lock(api_mu);
    api_ptr = api.get();
  }
  feed->attach(dash.get());
  auto published = actors::publish(coord, port, host);
  if (!published) {
    std::cerr << "troupe coordinator: cannot listen on " << o.listen << ": " << sys.render(published.error())
              << "\n";
    {
      std::lock_guard<std::mutex> lock(api_mu);
      api_ptr = nullptr;
    }
    feed->detach();
    if (dash) dash->stop();
    api->stop();
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return 2;
  }
  std::string listen = host + ":" + std::to_string(*published);
  nlohmann::json ready = {
      {"listen", listen}, {"api", api->endpoint()}, {"pub", api->pub_endpoint()}, {"pid", getpid()}};
  if (dash) ready["http"] = dash->address();
  if (!o.state_dir.empty())
    std::cout << "troupe coordinator: job table in " << state_file(o.state_dir) << " (" << loaded_jobs
              << " job(s) loaded)" << std::endl;
  std::cout << "troupe coordinator: agents and workers connect to " << listen << "; API " << api->endpoint()
            << ", events " << api->pub_endpoint() << std::endl;
  if (dash)
    std::cout << "troupe coordinator: dashboard " << dash->url()
              << (dash->requires_token()
                      ? " (open it as ?token=<the API token>: `troupe secret api-token FILE`)"
                      : "")
              << std::endl;
  if (!o.ready_file.empty()) {
    std::string tmp = o.ready_file + ".tmp";
    std::ofstream(tmp) << ready.dump() << "\n";
    std::rename(tmp.c_str(), o.ready_file.c_str());
  }

  int sig = 0;
  while (sig <= 0) sig = sigwaitinfo(&sigs, nullptr);
  // With a state directory the jobs outlive this process: a coordinator started
  // again on the same directory continues them from their checkpoints.
  const bool keep_jobs = !o.state_dir.empty();
  std::cout << "troupe coordinator: " << (sig == SIGINT ? "interrupted" : "terminated")
            << (keep_jobs ? ", jobs kept in " + state_file(o.state_dir) : ", cancelling running jobs")
            << std::endl;
  auto list = nlohmann::json::parse(ask(R"({"op":"list"})"), nullptr, false);
  if (!keep_jobs && list.is_object() && list.contains("jobs"))
    for (const auto& j : list["jobs"]) {
      std::string st = j.value("state", "");
      if (st != "succeeded" && st != "failed" && st != "cancelled")
        ask(nlohmann::json{{"op", "cancel"}, {"job", j["id"]}}.dump());
    }
  // The agents SIGKILL what is left when the coordinator goes; give the aborts a moment to leave first.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(api_mu);
    api_ptr = nullptr;
  }
  feed->detach();
  if (dash) dash->stop();
  api->stop();
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  return sig == SIGINT ? 130 : 0;
}

}  // namespace troupe::coord
