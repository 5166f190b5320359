// The cluster secret as a user meets it: `troupe secret init`, the checks every
// node makes before it starts, and an agent that starts before its coordinator.
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "actors/secret.hpp"
#include "actors/tls.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;
using troupe::testing::run_troupe;

namespace {

// A port that was free a moment ago (bound to 0, read back, closed).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("secret: init writes a private secret and never overwrites one", "[security][cli]") {
  const std::string dir = troupe::testing::temp_dir("secret_init");
  const std::string f = dir + "/cluster.pem";
  auto r = run_troupe("secret init " + f);
  CHECK(r.code == 0);
  struct stat st {};
  REQUIRE(::stat(f.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK_NOTHROW(actors::check_secret(f));
  const std::string first = read_file(f);
  r = run_troupe("secret init " + f);
  CHECK(r.code == 2);
  CHECK(r.out.find("never overwritten") != std::string::npos);
  CHECK(read_file(f) == first);
  // Two secrets differ.
  run_troupe("secret init " + dir + "/other.pem");
  CHECK(read_file(dir + "/other.pem") != first);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "secret: a process parses its secret once for all its TLS connections and again when the file changes",
    "[security]") {
  const std::string dir = troupe::testing::temp_dir("secret_shared");
  const std::string f = dir + "/cluster.pem";
  actors::write_secret(f);
  // The calls libcaf_openssl makes for each connection's context (actors/tls.hpp).
  auto context = [](const std::string& cert, const std::string& key) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_method());
    REQUIRE(ctx != nullptr);
    const bool ok = SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) == 1 &&
                    SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) == 1 &&
                    SSL_CTX_load_verify_locations(ctx, cert.c_str(), nullptr) == 1;
    return std::make_pair(std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)>(ctx, SSL_CTX_free), ok);
  };
  auto trusts = [](SSL_CTX* ctx, X509* cert) {
    std::unique_ptr<X509_STORE_CTX, void (*)(X509_STORE_CTX*)> check(X509_STORE_CTX_new(),
                                                                     X509_STORE_CTX_free);
    return X509_STORE_CTX_init(check.get(), SSL_CTX_get_cert_store(ctx), cert, nullptr) == 1 &&
           X509_verify_cert(check.get()) == 1;
  };
  auto [a, a_ok] = context(f, f);
  auto [b, b_ok] = context(f, f);
  REQUIRE(a_ok);
  REQUIRE(b_ok);
  CHECK(SSL_CTX_get0_certificate(a.get()) == SSL_CTX_get0_certificate(b.get()));
  CHECK(SSL_CTX_get0_privatekey(a.get()) == SSL_CTX_get0_privatekey(b.get()));
  CHECK(SSL_CTX_get_cert_store(a.get()) == SSL_CTX_get_cert_store(b.get()));
  CHECK(SSL_CTX_check_private_key(b.get()) == 1);
  CHECK(trusts(b.get(), SSL_CTX_get0_certificate(a.get())));
  // A connection holds no buffers while it has nothing buffered.
  std::unique_ptr<SSL, void (*)(SSL*)> conn(SSL_new(b.get()), SSL_free);
  REQUIRE(conn != nullptr);
  CHECK((SSL_get_mode(conn.get()) & SSL_MODE_RELEASE_BUFFERS) != 0);

  // A new secret in the same file is read again, and the old one is no longer trusted.
  std::filesystem::remove(f);
  actors::write_secret(f);
  auto [c, c_ok] = context(f, f);
  REQUIRE(c_ok);
  CHECK(X509_cmp(SSL_CTX_get0_certificate(c.get()), SSL_CTX_get0_certificate(a.get())) != 0);
  CHECK(!trusts(c.get(), SSL_CTX_get0_certificate(a.get())));
  CHECK(trusts(c.get(), SSL_CTX_get0_certificate(c.get())));
  // The contexts made before keep what they were made with.
  CHECK(SSL_CTX_check_private_key(a.get()) == 1);

  // Refused as libssl refuses: a key that is not the certificate's, a file that is not there.
  const std::string other = dir + "/other.pem";
  actors::write_secret(other);
  auto [d, d_ok] = context(f, other);
  CHECK(!d_ok);
  auto [e, e_ok] = context(dir + "/absent.pem", dir + "/absent.pem");
  CHECK(!e_ok);

  // Authorities added to one context are its own: the store it shared gains nothing.
  auto held = [](SSL_CTX* ctx) {
    return sk_X509_OBJECT_num(X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx)));
  };
  const int before = held(a.get());
  REQUIRE(SSL_CTX_load_verify_locations(b.get(), other.c_str(), nullptr) == 1);
  CHECK(SSL_CTX_get_cert_store(b.get()) != SSL_CTX_get_cert_store(a.get()));
  CHECK(held(a.get()) == before);
  CHECK(held(b.get()) == before + 1);
  CHECK(trusts(b.get(), SSL_CTX_get0_certificate(a.get())));
  std::filesystem::remove_all(dir);
}

namespace {

// Signal `sig`'s bit in this thread's line `field` (SigBlk, SigPnd) of /proc: what the kernel
// holds, whatever the process's own calls answer. -1: no such line.
int kernel_bit(const char* field, int sig) {
  const std::string path = "/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/status";
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(std::string(field) + ":", 0) == 0)
      return int((std::stoull(line.substr(line.find(':') + 1), nullptr, 16) >> (sig - 1)) & 1);
  return -1;
}

// What libcaf_openssl wraps around each TLS call; `raise_pipe`: the call raises a SIGPIPE.
bool caf_tls_call(bool raise_pipe) {
  sigset_t pipe, saved;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  if (pthread_sigmask(SIG_BLOCK, &pipe, &saved) != 0) return false;
  if (raise_pipe) pthread_kill(pthread_self(), SIGPIPE);
  struct timespec zero {};
  sigtimedwait(&pipe, nullptr, &zero);
  return pthread_sigmask(SIG_SETMASK, &saved, nullptr) == 0;
}

int blocked_as_seen(int sig) {
  sigset_t now;
  if (pthread_sigmask(SIG_BLOCK, nullptr, &now) != 0) return -1;
  return sigismember(&now, sig);
}

}  // namespace

TEST_CASE(
    "tls: a thread that blocks SIGPIPE around each TLS call keeps it blocked, and its code sees its own mask",
    "[security]") {
  // A SIGPIPE that got through would end this process (default action): it must not.
  struct sigaction dfl {
  }, old{};
  dfl.sa_handler = SIG_DFL;
  REQUIRE(sigaction(SIGPIPE, &dfl, &old) == 0);
  // Observed on a thread of its own (a fresh mask state), checked here: Catch2 asserts on
  // the test's thread only.
  std::vector<std::pair<std::string, int>> seen;  // what, and 1 / 0 (-1: could not tell)
  std::thread([&seen] {
    auto note = [&](const char* what, int v) { seen.emplace_back(what, v); };
    sigset_t pipe, usr;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigemptyset(&usr);
    sigaddset(&usr, SIGUSR1);
    note("a fresh thread: SIGPIPE blocked", kernel_bit("SigBlk", SIGPIPE));
    note("calls made", caf_tls_call(false));
    // Held: blocked in the kernel, not as the thread's code sees it.
    note("after a call: SIGPIPE blocked in the kernel", kernel_bit("SigBlk", SIGPIPE));
    note("calls made", caf_tls_call(true) && caf_tls_call(false));
    note("after a call that raised one: SIGPIPE blocked in the kernel", kernel_bit("SigBlk", SIGPIPE));
    note("after a call that raised one: SIGPIPE pending", kernel_bit("SigPnd", SIGPIPE));
    note("SIGPIPE blocked as the code sees it", blocked_as_seen(SIGPIPE));
    // That call put the mask back as the code set it, the pending SIGPIPE swallowed first.
    note("after the code asked: SIGPIPE blocked in the kernel", kernel_bit("SigBlk", SIGPIPE));
    note("after the code asked: SIGPIPE pending", kernel_bit("SigPnd", SIGPIPE));

    // A signal the code blocks meanwhile stays blocked through the calls.
    note("calls made", caf_tls_call(false));
    note("SIGUSR1 blocked by the code", pthread_sigmask(SIG_BLOCK, &usr, nullptr) == 0);
    note("SIGUSR1 blocked in the kernel", kernel_bit("SigBlk", SIGUSR1));
    note("calls made", caf_tls_call(true));
    note("SIGUSR1 blocked in the kernel after a call", kernel_bit("SigBlk", SIGUSR1));
    note("SIGUSR1 blocked as the code sees it", blocked_as_seen(SIGUSR1));
    note("SIGPIPE blocked as the code sees it", blocked_as_seen(SIGPIPE));
    note("SIGUSR1 unblocked by the code", pthread_sigmask(SIG_UNBLOCK, &usr, nullptr) == 0);

    // Code that blocks SIGPIPE itself keeps it blocked through the calls.
    note("SIGPIPE blocked by the code", pthread_sigmask(SIG_BLOCK, &pipe, nullptr) == 0);
    note("calls made", caf_tls_call(false));
    note("SIGPIPE blocked by the code, as it sees it", blocked_as_seen(SIGPIPE));
    note("SIGPIPE blocked by the code, in the kernel", kernel_bit("SigBlk", SIGPIPE));
    note("SIGPIPE unblocked by the code", pthread_sigmask(SIG_UNBLOCK, &pipe, nullptr) == 0);
    note("SIGPIPE unblocked by the code, in the kernel", kernel_bit("SigBlk", SIGPIPE));

    // Off: every call goes to libc, SIGPIPE unblocked after each.
    actors::hold_sigpipe(false);
    note("calls made", caf_tls_call(true));
    note("off: after a call, SIGPIPE blocked in the kernel", kernel_bit("SigBlk", SIGPIPE));
    actors::hold_sigpipe(true);
  }).join();
  REQUIRE(sigaction(SIGPIPE, &old, nullptr) == 0);
  const std::map<std::string, int> expected = {
      {"a fresh thread: SIGPIPE blocked", 0},
      {"calls made", 1},
      {"after a call: SIGPIPE blocked in the kernel", 1},
      {"after a call that raised one: SIGPIPE blocked in the kernel", 1},
      {"after a call that raised one: SIGPIPE pending", 1},
      {"SIGPIPE blocked as the code sees it", 0},
      {"after the code asked: SIGPIPE blocked in the kernel", 0},
      {"after the code asked: SIGPIPE pending", 0},
      {"SIGUSR1 blocked by the code", 1},
      {"SIGUSR1 blocked in the kernel", 1},
      {"SIGUSR1 blocked in the kernel after a call", 1},
      {"SIGUSR1 blocked as the code sees it", 1},
      {"SIGUSR1 unblocked by the code", 1},
      {"SIGPIPE blocked by the code", 1},
      {"SIGPIPE blocked by the code, as it sees it", 1},
      {"SIGPIPE blocked by the code, in the kernel", 1},
      {"SIGPIPE unblocked by the code", 1},
      {"SIGPIPE unblocked by the code, in the kernel", 0},
      {"off: after a call, SIGPIPE blocked in the kernel", 0},
  };
  REQUIRE(seen.size() == 25);
  for (const auto& [what, v] : seen) {
    INFO(what);
    REQUIRE(expected.count(what) == 1);
    CHECK(v == expected.at(what));
  }
}

TEST_CASE("secret: a coordinator or agent without a good secret refuses to start, saying how to fix it",
          "[security][cli]") {
  const std::string dir = troupe::testing::temp_dir("secret_bad");
  const std::string base = " --listen 127.0.0.1:0 --api tcp://127.0.0.1:0 --runs-dir " + dir + "/runs";
  auto r = run_troupe("coordinator" + base, "env -u TROUPE_SECRET_FILE");
  CHECK(r.code == 2);
  CHECK(r.out.find("troupe secret init") != std::string::npos);

  const std::string open = dir + "/open.pem";
  actors::write_secret(open);
  ::chmod(open.c_str(), 0644);
  r = run_troupe("coordinator" + base + " --secret-file " + open);
  CHECK(r.code == 2);
  CHECK(r.out.find("chmod 600") != std::string::npos);

  const std::string junk = dir + "/junk.pem";
  std::ofstream(junk) << "not a secret\n";
  ::chmod(junk.c_str(), 0600);
  r = run_troupe("coordinator" + base + " --secret-file " + junk);
  CHECK(r.code == 2);
  CHECK(r.out.find("no PEM certificate") != std::string::npos);

  r = run_troupe("coordinator" + base + " --secret-file " + dir + "/missing.pem");
  CHECK(r.code == 2);
  CHECK(r.out.find("missing.pem") != std::string::npos);

  r = run_troupe("agent --coordinator 127.0.0.1:1 --devices cpu:1", "env -u TROUPE_SECRET_FILE");
  CHECK(r.code == 2);
  CHECK(r.out.find("troupe secret init") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("secret: TROUPE_SECRET_FILE stands in for --secret-file, clients derive the API token from it",
          "[security][multiprocess]") {
  const std::string dir = troupe::testing::temp_dir("secret_env");
  const std::string s = dir + "/s.pem";
  actors::write_secret(s);
  ::setenv(actors::kSecretEnv, s.c_str(), 1);
  Proc coordinator({troupe_binary(), "coordinator", "--listen", "127.0.0.1:0", "--api", "tcp://127.0.0.1:0",
                    "--runs-dir", dir + "/runs", "--ready-file", dir + "/ready.json"},
                   dir + "/coordinator.log");
  ::unsetenv(actors::kSecretEnv);
  CHECK(wait_until([&] { return std::filesystem::exists(dir + "/ready.json"); }, 30s));
  INFO(coordinator.output());
  CHECK(coordinator.wait(0ms) == -1);
  // The client commands derive the API token from the same variable; without it they are refused.
  const std::string api = json::parse(read_file(dir + "/ready.json"))["api"];
  auto listed = run_troupe("list --api " + api, "TROUPE_SECRET_FILE=" + s);
  CHECK(listed.code == 0);
  auto refused = run_troupe("list --api " + api, "env -u TROUPE_SECRET_FILE");
  CHECK(refused.code != 0);
  CHECK(refused.out.find("unauthorized") != std::string::npos);
  auto printed = run_troupe("secret api-token " + s);
  CHECK(printed.code == 0);
  CHECK(printed.out == actors::api_token(s) + "\n");
  CHECK(actors::api_token(s).size() == 64);
  coordinator.signal(SIGTERM);
  CHECK(coordinator.wait(30s) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("secret: an agent started before its coordinator keeps trying and registers once it listens",
          "[security][multiprocess]") {
  const std::string dir = troupe::testing::temp_dir("secret_early");
  const std::string s = dir + "/s.pem";
  actors::write_secret(s);
  // The port is free when chosen, but another process (or one of the agent's own connection
  // attempts, whose source port may be that very port) can hold it by the time the coordinator
  // binds: then both start again on another port.
  std::unique_ptr<Proc> agent, coordinator;
  bool ready = false;
  for (int attempt = 0; attempt < 5 && !ready; ++attempt) {
    std::filesystem::remove(dir + "/ready.json");
    const std::string listen = "127.0.0.1:" + std::to_string(free_port());
    agent = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "agent", "--coordinator", listen, "--devices", "cpu:1",
                                 "--secret-file", s, "--reconnect-timeout", "120"},
        dir + "/agent.log");
    // Observable state, not a delay: the agent has failed to connect at least once.
    REQUIRE(wait_until([&] { return agent->output().find("retrying for up to") != std::string::npos; }, 60s));
    CHECK(agent->wait(0ms) == -1);
    coordinator = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "coordinator", "--listen", listen, "--api",
                                 "tcp://127.0.0.1:0", "--runs-dir", dir + "/runs", "--ready-file",
                                 dir + "/ready.json", "--secret-file", s},
        dir + "/coordinator.log");
    bool exited = false;
    REQUIRE(wait_until(
        [&] {
          ready = std::filesystem::exists(dir + "/ready.json");
          exited = !ready && coordinator->wait(0ms) != -1;
          return ready || exited;
        },
        30s));
    if (exited) REQUIRE(coordinator->output().find("cannot listen") != std::string::npos);
  }
  REQUIRE(ready);
  const std::string api = json::parse(read_file(dir + "/ready.json"))["api"];
  coord::ClientOptions o;
  o.endpoint = api;
  o.token = actors::api_token(s);
  INFO(agent->output());
  CHECK(wait_until(
      [&] {
        auto r = coord::api_call(o, {{"op", "list"}});
        return r.value("ok", false) && r["devices"]["cpu"]["total"] == 1;
      },
      60s));
  std::filesystem::remove_all(dir);
}

TEST_CASE("devices: an agent offers only GPUs that exist", "[security][cli]") {
  if (std::filesystem::exists("/proc/driver/nvidia/gpus")) {
    WARN("skipped: this host has NVIDIA GPUs");
    return;
  }
  const std::string dir = troupe::testing::temp_dir("devices");
  const std::string s = dir + "/s.pem";
  actors::write_secret(s);
  for (const char* d : {"cuda:0", "cuda:all", "cuda:0,1"}) {
    auto r =
        run_troupe(std::string("agent --coordinator 127.0.0.1:1 --secret-file ") + s + " --devices " + d);
    INFO(d << ": " << r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("GPU") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
