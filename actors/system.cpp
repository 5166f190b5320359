#include "actors/system.hpp"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include "actors/protocol.hpp"
#include "core/error.hpp"

// CAF's OpenSSL session (0.17.6) reads SSL_get_error() after each SSL call
// without clearing the thread's OpenSSL error queue first, and one multiplexer
// thread serves every connection: an error left by one peer (a closed
// connection, a stranger's failed handshake) made the next call on another,
// healthy connection look failed, and CAF closed it. Measured: a worker that
// exited after its abort took its agent's connection with it. OpenSSL requires
// an empty queue before each I/O call; these definitions in the executable
// take precedence over libssl's for libcaf_openssl and clear it, then call
// libssl.
extern "C" {
#define TROUPE_SSL_CLEAN_CALL(ret, name, params, args)              \
  ret name params {                                                 \
    ERR_clear_error();                                              \
    using Fn = ret(*) params;                                       \
    static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, #name)); \
    return real args;                                               \
  }
TROUPE_SSL_CLEAN_CALL(int, SSL_read, (SSL * s, void* buf, int n), (s, buf, n))
TROUPE_SSL_CLEAN_CALL(int, SSL_write, (SSL * s, const void* buf, int n), (s, buf, n))
TROUPE_SSL_CLEAN_CALL(int, SSL_connect, (SSL * s), (s))
TROUPE_SSL_CLEAN_CALL(int, SSL_accept, (SSL * s), (s))
#undef TROUPE_SSL_CLEAN_CALL
}

namespace troupe::actors {

NodeConfig::NodeConfig(const std::string& secret_file) {
  add_message_type<AgentHello>("troupe::AgentHello");
  add_message_type<Welcome>("troupe::Welcome");
  add_message_type<LaunchRequest>("troupe::LaunchRequest");
  add_message_type<WorkerExit>("troupe::WorkerExit");
  add_message_type<WorkerStopped>("troupe::WorkerStopped");
  add_message_type<WorkerHello>("troupe::WorkerHello");
  add_message_type<Assignment>("troupe::Assignment");
  add_message_type<StepMetrics>("troupe::StepMetrics");
  add_message_type<WorkerResult>("troupe::WorkerResult");
  add_message_type<KillRequest>("troupe::KillRequest");
  add_message_type<StoreKey>("troupe::StoreKey");
  add_message_type<StoreValue>("troupe::StoreValue");
  add_message_type<CkptFile>("troupe::CkptFile");
  add_message_type<CkptShard>("troupe::CkptShard");
  add_message_type<CkptCommitted>("troupe::CkptCommitted");
  add_message_type<std::vector<std::string>>("std::vector<std::string>");
  load<caf::io::middleman>();
  load<caf::openssl::manager>();
  // One file is this node's certificate, its key and the only authority it trusts.
  openssl_certificate = secret_file;
  openssl_key = secret_file;
  openssl_cafile = secret_file;
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
