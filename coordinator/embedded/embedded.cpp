#include "coordinator/embedded/embedded.hpp"

#include <signal.h>

#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "coordinator/coordinator_actor.hpp"
#include "coordinator/dashboard_server.hpp"
#include "coordinator/spec_request.hpp"
#include "worker/agent.hpp"
#include "worker/node.hpp"

namespace troupe::embedded {

namespace {

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<nlohmann::json> events;
  bool agent_stopped = false;
  int agent_code = 0;
  std::string agent_why;
};

}  // namespace

int run_job_embedded(const JobSpec& spec, const RunOptions& o) {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &sigs, &old);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};

  std::vector<std::string> devices;
  try {
    const coord::JobRequest req = coord::job_request(spec, o.hardware);
    devices = worker::expand_devices(
        o.devices.empty() ? worker::local_devices(req.device_kind, req.layout.world() + req.spares)
                          : o.devices);
  } catch (const std::exception& e) {
    std::cerr << "troupe run: " << e.what() << "\n";
    return 2;
  }

  // The run's own workers hold a secret made for this run alone (removed at the end).
  std::unique_ptr<actors::EphemeralSecret> secret;
  try {
    secret = std::make_unique<actors::EphemeralSecret>();
  } catch (const std::exception& e) {
    std::cerr << "troupe run: " << e.what() << "\n";
    return 1;
  }
  auto inbox = std::make_shared<Inbox>();
  auto feed = std::make_shared<coord::DashboardFeed>();  // the coordinator's events to --http's dashboard
  actors::NodeConfig cfg(secret->path());
  caf::actor_system sys{cfg};
  coord::CoordinatorActorOptions copt;
  copt.runs_dir = o.runs_dir;
  copt.default_hardware = o.hardware;
  copt.on_event = [inbox, feed](const std::string& e) {
    feed->publish(e);
    std::lock_guard<std::mutex> lock(inbox->mu);
    inbox->events.push_back(nlohmann::json::parse(e));
    inbox->cv.notify_all();
  };
  auto coordinator = coord::spawn_coordinator(sys, copt);
  auto published = actors::publish(coordinator, 0, "127.0.0.1");
  if (!published) {
    std::cerr << "troupe run: cannot listen on 127.0.0.1: " << sys.render(published.error()) << "\n";
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    return 1;
  }
  worker::AgentActorOptions aopt;
  aopt.coordinator_address = "127.0.0.1:" + std::to_string(*published);
  aopt.devices = devices;
  aopt.worker_binary = o.worker_binary;
  aopt.secret_file = secret->path();
  aopt.on_stop = [inbox](int code, const std::string& why) {
    std::lock_guard<std::mutex> lock(inbox->mu);
    inbox->agent_stopped = true;
    inbox->agent_code = code;
    inbox->agent_why = why;
    inbox->cv.notify_all();
  };
  auto agent = worker::spawn_agent(sys, coordinator, aopt);

  auto ask = [&](const nlohmann::json& r) {
    caf::scoped_actor self{sys};
    nlohmann::json out;
    self->request(coordinator, std::chrono::seconds(10), actors::api_atom::value, r.dump())
        .receive([&](std::string& s) { out = nlohmann::json::parse(s); },
                 [&](caf::error& e) {
                   out = {{"ok", false}, {"error", "internal"}, {"message", sys.render(e)}};
                 });
    return out;
  };
  std::unique_ptr<coord::DashboardServer> dash;
  coord::DashboardFeed::DetachOnExit detach_on_exit{*feed};
  auto finish = [&](int code) {
    feed->detach();  // first, and not while stopping: the server may be waiting on the coordinator
    if (dash) dash->stop();
    caf::anon_send(agent, actors::shutdown_atom::value);
    std::unique_lock<std::mutex> lock(inbox->mu);
    inbox->cv.wait_for(lock, std::chrono::seconds(10), [&] { return inbox->agent_stopped; });
    lock.unlock();
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    return code;
  };

  if (!o.http.empty()) {
    try {
      const std::string token = actors::api_token(secret->path());
      dash = std::make_unique<coord::DashboardServer>(
          coord::DashboardOptions{o.http, token},
          [&](const std::string& r) { return ask(nlohmann::json::parse(r)).dump(); });
      feed->attach(dash.get());
      std::cout << "troupe run: dashboard " << dash->url()
                << (dash->requires_token() ? "?token=" + token : "") << std::endl;
    } catch (const std::exception& e) {
      std::cerr << "troupe run: --http: " << e.what() << "\n";
      return finish(2);
    }
  }

  nlohmann::json submit = {{"op", "submit"}, {"spec", to_yaml(spec)}, {"filename", spec.source_file}};
  if (!o.resume_from.empty()) submit["resume"] = o.resume_from;
  auto sub = ask(submit);
  if (!sub.value("ok", false)) {
    std::cerr << "troupe run: " << sub.value("message", sub.dump()) << "\n";
    return finish(sub.value("error", "") == "invalid_spec" ? 2 : 1);
  }
  const std::string job = sub["job"];
  if (o.on_submitted)
    o.on_submitted(job, sub.value("run_dir", ""));
  else if (!o.quiet)
    std::cout << "job " << job << " -> " << sub.value("run_dir", "") << std::endl;

  bool interrupted = false;
  timespec no_wait{0, 0};
  while (true) {
    if (!interrupted && sigtimedwait(&sigs, nullptr, &no_wait) > 0) {
      interrupted = true;
      std::cerr << "troupe run: interrupted, cancelling job " << job << "\n";
      ask({{"op", "cancel"}, {"job", job}});
    }
    std::unique_lock<std::mutex> lock(inbox->mu);
    inbox->cv.wait_for(lock, std::chrono::milliseconds(50),
                       [&] { return !inbox->events.empty() || inbox->agent_stopped; });
    if (inbox->agent_stopped) {
      std::cerr << "troupe run: the local agent stopped: " << inbox->agent_why << "\n";
      lock.unlock();
      return finish(interrupted ? 130 : 1);
    }
    auto events = std::move(inbox->events);
    inbox->events.clear();
    lock.unlock();
    for (const auto& e : events) {
      if (e.value("job", "") != job) continue;
      const std::string kind = e.value("event", "");
      if (kind == "plan" && o.on_plan) o.on_plan(e);
      if (kind == "step" && o.on_step) {
        o.on_step(e["metrics"]);
      } else if (kind == "step" && !o.quiet) {
        const auto& m = e["metrics"];
        std::cout << "step " << m["step"].get<int64_t>() << " loss " << m["loss"].get<double>() << " ("
                  << m["step_ms"].get<double>() << " ms";
        if (m.contains("val_loss")) std::cout << ", val_loss " << m["val_loss"].get<double>();
        std::cout << ")" << std::endl;
      }
      if (kind != "state") continue;
      const std::string st = e.value("state", "");
      if (st == "succeeded") {
        if (!o.quiet && !o.on_step)
          std::cout << "job " << job << " succeeded: " << e.value("reason", "") << std::endl;
        return finish(interrupted ? 130 : 0);
      }
      if (st == "failed" || st == "cancelled") {
        if (!interrupted)
          std::cerr << "troupe run: job " << job << " " << st << ": " << e.value("reason", "") << "\n";
        return finish(interrupted ? 130 : 1);
      }
    }
  }
}

}  // namespace troupe::embedded
