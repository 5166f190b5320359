#include "actors/system.hpp"

#include <unistd.h>

#include "actors/protocol.hpp"
#include "actors/tls.hpp"
#include "core/error.hpp"

namespace troupe::actors {

NodeConfig::NodeConfig(const std::string& secret_file) {
  TROUPE_CHECK(
      basp_guard_active(),
      "the control plane cannot guard CAF's message dispatch (caf::io::basp::instance::handle not found "
      "in libcaf_io): this build needs CAF 0.17.6");
  add_message_type<AgentHello>("troupe::AgentHello");
  add_message_type<Welcome>("troupe::Welcome");
  add_message_type<LaunchRequest>("troupe::LaunchRequest");
  add_message_type<WorkerExit>("troupe::WorkerExit");
  add_message_type<WorkerStopped>("troupe::WorkerStopped");
  add_message_type<WorkerHello>("troupe::WorkerHello");
  add_message_type<Assignment>("troupe::Assignment");
  add_message_type<StepMetrics>("troupe::StepMetrics");
  add_message_type<std::vector<StepMetrics>>("std::vector<troupe::StepMetrics>");
  add_message_type<WorkerResult>("troupe::WorkerResult");
  add_message_type<KillRequest>("troupe::KillRequest");
  add_message_type<WhereAnswers>("troupe::WhereAnswers");
  add_message_type<std::vector<worker_actor>>("std::vector<troupe::worker_actor>");
  add_message_type<StoreKey>("troupe::StoreKey");
  add_message_type<StoreValue>("troupe::StoreValue");
  add_message_type<CkptFile>("troupe::CkptFile");
  add_message_type<CkptShard>("troupe::CkptShard");
  add_message_type<CkptCommitted>("troupe::CkptCommitted");
  add_message_type<std::vector<std::string>>("std::vector<std::string>");
  add_message_type<coordinator_actor>("troupe::coordinator_actor");  // an agent's relay (worker/relay.hpp)
  load<caf::io::middleman>();
  // One file is this node's certificate, its key and the only authority it trusts.
  use_cluster_secret(*this, secret_file);
  set("middleman.heartbeat-interval", caf::timespan{kHeartbeatInterval});
  set("middleman.connection-timeout", caf::timespan{kConnectionTimeout});
  // Control traffic is light; two scheduler threads leave the cores to the engine.
  set("scheduler.max-threads", size_t{2});
  // Work stealing keeps idle threads polling with short sleeps: measured 7.6 % of
  // a core in `troupe run`'s process during training, taken from the workers on
  // a small machine. The sharing policy's threads block on one queue instead.
  set("scheduler.policy", caf::atom("sharing"));
  set("logger.console", caf::atom("none"));
}

std::pair<std::string, uint16_t> parse_host_port(const std::string& address) {
  auto colon = address.rfind(':');
  TROUPE_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
               "expected HOST:PORT, got '", address, "'");
  std::string host = address.substr(0, colon);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  TROUPE_CHECK(port >= 0 && port <= 65535, "bad port in '", address, "'");
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(port)};
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace troupe::actors
