// The control plane end to end: a coordinator and agents as separate processes
// of the built `troupe` binary, on loopback with ephemeral ports. Jobs that a test
// cancels, kills or interrupts are endless (kEndlessSteps), so none ends first.
#include <catch2/catch.hpp>
#include <zmq.hpp>

#include "actors/version.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

using namespace troupe::test;
using nlohmann::json;
using troupe::testing::kEndlessSteps;
using namespace std::chrono_literals;

TEST_CASE("a job submitted through the API trains on worker processes, list and status tell the truth",
          "[control][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(4));

  auto sub = c.call({{"op", "submit"}, {"spec", tiny_spec("e2e", 6)}, {"filename", "e2e.yaml"}});
  REQUIRE(sub["ok"] == true);
  std::string job = sub["job"];
  REQUIRE(c.wait_state(job, "succeeded"));

  auto st = c.status(job);
  CHECK(st["steps_done"] == 6);
  CHECK(st["failure"] == "");
  CHECK(st["layout"] == "1x1x1");
  REQUIRE(st["workers"].size() == 1);
  int pid = st["workers"][0]["pid"];
  CHECK(pid > 0);
  CHECK(pid != c.coordinator_pid());
  CHECK(wait_until([&] { return !process_alive(pid); }, 10s));
  INFO("first step after " << st.value("first_step_latency_ms", -1.0) << " ms");
  CHECK(st.contains("first_step_latency_ms"));

  std::string run_dir = st["run_dir"];
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto m = json::parse(line);
    CHECK(m["step"] == lines);
    CHECK(m["loss"].get<double>() > 0);
    CHECK(m["layout"] == "1x1x1");
    CHECK(m.contains("tokens_per_s"));
    ++lines;
  }
  CHECK(lines == 6);
  auto events = read_file(run_dir + "/events.log");
  for (const char* s : {"state queued", "state launching", "state running", "state succeeded"})
    CHECK(events.find(s) != std::string::npos);
  CHECK(read_file(run_dir + "/workers/0.log").find("step 5") != std::string::npos);
  CHECK(read_file(run_dir + "/spec.yaml").find("e2e") != std::string::npos);

  auto list = c.call({{"op", "list"}});
  REQUIRE(list["ok"] == true);
  REQUIRE(list["jobs"].size() == 1);
  CHECK(list["jobs"][0]["state"] == "succeeded");
  CHECK(list["devices"]["cpu"]["total"] == 4);
  CHECK(list["devices"]["cpu"]["free"] == 4);
  CHECK(list["agents"].size() == 2);
}

TEST_CASE("cancel mid-run stops every worker process", "[control][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  std::string job = c.call({{"op", "submit"}, {"spec", tiny_spec("long", kEndlessSteps)}})["job"];
  REQUIRE(c.wait_state(job, [](const json& s) { return s["state"] == "running" && s["steps_done"] > 0; }));
  auto pids = worker_pids(c.status(job));
  REQUIRE(pids.size() == 1);
  CHECK(process_alive(pids[0]));

  auto r = c.call({{"op", "cancel"}, {"job", job}});
  CHECK(r["ok"] == true);
  CHECK(c.status(job)["state"] == "cancelled");
  CHECK(wait_until([&] { return !process_alive(pids[0]); }, 15s));
  auto again = c.call({{"op", "cancel"}, {"job", job}});
  CHECK(again["error"] == "already_finished");
  CHECK(c.call({{"op", "list"}})["devices"]["cpu"]["free"] == 1);
}

TEST_CASE("a SIGKILLed worker is reported as a named failure", "[control][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  // Without restarts a failure ends the job (tests/fault covers recovery).
  std::string spec = tiny_spec("victim", kEndlessSteps) + "\nfault:\n  max_restarts: 0\n";
  std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  REQUIRE(c.wait_state(job, [](const json& s) { return s["state"] == "running" && s["steps_done"] > 0; }));
  int pid = worker_pids(c.status(job))[0];
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(c.wait_state(job, "failed", 30s));
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto st = c.status(job);
  CHECK(st["failure"] == "worker_killed");
  std::string reason = st["reason"];
  CHECK(reason.find("rank 0 (pid " + std::to_string(pid)) != std::string::npos);
  CHECK(reason.find("killed by SIGKILL") != std::string::npos);
  WARN("SIGKILL -> failed state seen by a polling client after " << ms << " ms");
  CHECK(read_file(std::string(st["run_dir"]) + "/events.log").find("state failed: worker_killed") !=
        std::string::npos);
}

TEST_CASE("two jobs that fit run at once, a third waits with its reason", "[control][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(2));
  std::string a = c.call({{"op", "submit"}, {"spec", tiny_spec("a", kEndlessSteps)}})["job"];
  std::string b = c.call({{"op", "submit"}, {"spec", tiny_spec("b", kEndlessSteps)}})["job"];
  std::string w = c.call({{"op", "submit"}, {"spec", tiny_spec("w", kEndlessSteps)}})["job"];
  REQUIRE(c.wait_state(a, [](const json& s) { return s["steps_done"] > 0; }));
  REQUIRE(c.wait_state(b, [](const json& s) { return s["steps_done"] > 0; }));
  CHECK(c.status(a)["state"] == "running");
  CHECK(c.status(b)["state"] == "running");
  CHECK(c.status(a)["workers"][0]["agent"] != c.status(b)["workers"][0]["agent"]);
  auto ws = c.status(w);
  CHECK(ws["state"] == "queued");
  CHECK(ws["reason"] == "waiting for 1 free cpu device(s): 0 free of 2 registered");

  REQUIRE(c.call({{"op", "cancel"}, {"job", a}})["ok"] == true);
  REQUIRE(c.wait_state(w, "running"));
  for (const auto& j : {b, w}) CHECK(c.call({{"op", "cancel"}, {"job", j}})["ok"] == true);
}

namespace {

// One raw request on a fresh DEALER socket; nullopt when no reply comes.
std::optional<std::string> raw_request(const std::string& endpoint, const std::string& payload,
                                       std::chrono::milliseconds wait = 5s) {
  zmq::context_t ctx{1};
  zmq::socket_t s{ctx, zmq::socket_type::dealer};
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  s.send(zmq::buffer(payload), zmq::send_flags::none);
  zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, wait);
  if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;
  zmq::message_t m;
  (void)s.recv(m, zmq::recv_flags::none);
  return m.to_string();
}

// A JSON object text with the cluster's API token added as its first field.
std::string tokened(const Cluster& c, const std::string& object) {
  return "{\"token\":\"" + c.token() + "\"," + object.substr(1);
}

std::string error_of(const std::optional<std::string>& reply) {
  if (!reply) return "<no reply>";
  auto j = json::parse(*reply, nullptr, false);
  return j.is_object() ? j.value("error", "<ok>") : "<not json>";
}

}  // namespace

TEST_CASE("malformed API traffic gets an error reply or is dropped, and the coordinator keeps serving",
          "[control][api]") {
  Cluster c;
  REQUIRE(c.ready());
  CHECK(error_of(raw_request(c.api(), "this is not json")) == "bad_json");
  CHECK(error_of(raw_request(c.api(), "[1,2,3]")) == "bad_request");
  CHECK(error_of(raw_request(c.api(), R"({"op":"list"})")) == "unauthorized");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"no_op":1})"))) == "bad_request");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":42})"))) == "bad_request");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"frobnicate"})"))) == "unknown_op");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"status","job":5})"))) == "bad_request");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"status"})"))) == "bad_request");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"status","job":"nope"})"))) == "unknown_job");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"submit","spec":17})"))) == "bad_request");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"scale","job":"x","devices":4})"))) ==
        "unknown_job");
  CHECK(error_of(raw_request(c.api(), tokened(c, R"({"op":"scale","job":"x","devices":"4"})"))) ==
        "bad_request");
  auto invalid = c.call({{"op", "submit"}, {"spec", "name: x\nmodel: [oops\n"}, {"filename", "bad.yaml"}});
  CHECK(invalid["error"] == "invalid_spec");
  CHECK(invalid["message"].get<std::string>().find("bad.yaml:") != std::string::npos);

  // 100 MB is over ZMQ_MAXMSGSIZE: the connection is dropped, no reply.
  CHECK_FALSE(raw_request(c.api(), std::string(100 << 20, 'x'), 3s));
  // A client that sends and goes away before the reply.
  {
    zmq::context_t ctx{1};
    zmq::socket_t s{ctx, zmq::socket_type::dealer};
    s.set(zmq::sockopt::linger, 0);
    s.connect(c.api());
    s.send(zmq::buffer(tokened(c, R"({"op":"list"})")), zmq::send_flags::none);
  }
  // A REQ client (empty delimiter frame) is answered as well.
  {
    zmq::context_t ctx{1};
    zmq::socket_t s{ctx, zmq::socket_type::req};
    s.set(zmq::sockopt::linger, 0);
    s.connect(c.api());
    s.send(zmq::buffer(tokened(c, R"({"op":"list"})")), zmq::send_flags::none);
    zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, 5s);
    REQUIRE((items[0].revents & ZMQ_POLLIN));
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    CHECK(json::parse(m.to_string())["ok"] == true);
  }
  auto list = c.call({{"op", "list"}});
  CHECK(list["ok"] == true);
  CHECK(c.coordinator().wait(100ms) == -1);  // still running
}

TEST_CASE("an agent or worker speaking another protocol version is refused, naming both versions",
          "[control][protocol]") {
  Cluster c;
  REQUIRE(c.ready());
  Proc& bad = c.add_agent("cpu:1", {"--protocol-version-override", "99"});
  CHECK(bad.wait(30s) == 1);
  const std::string ours = std::to_string(troupe::actors::kProtocolVersion);
  CHECK(bad.output().find("protocol version mismatch: the agent speaks protocol 99, the coordinator speaks "
                          "protocol " +
                          ours) != std::string::npos);
  CHECK(c.call({{"op", "list"}})["devices"]["cpu"]["total"] == 0);

  c.add_agent("cpu:1", {"--worker-protocol-version-override", "98"});
  REQUIRE(c.wait_devices(1));
  std::string job = c.call({{"op", "submit"}, {"spec", tiny_spec("old", 3)}})["job"];
  REQUIRE(c.wait_state(job, "failed"));
  auto st = c.status(job);
  CHECK(st["failure"] == "protocol_mismatch");
  CHECK(st["reason"].get<std::string>().find(
            "the worker speaks protocol 98, the coordinator speaks protocol " + ours) != std::string::npos);
}

TEST_CASE("every API request must carry the token: the secret's, or the token file's", "[control][api]") {
  char tmpl[] = "/tmp/troupe-token-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  // Without a token file the token is the secret's (Cluster::token()), off loopback as on it.
  {
    Cluster open({}, "tcp://0.0.0.0:0");
    REQUIRE(open.ready());
    troupe::coord::ClientOptions o;
    o.endpoint = "tcp://127.0.0.1:" + open.api().substr(open.api().rfind(':') + 1);
    CHECK(troupe::coord::api_call(o, {{"op", "list"}})["error"] == "unauthorized");
    o.token = open.token();
    CHECK(troupe::coord::api_call(o, {{"op", "list"}})["ok"] == true);
  }
  std::ofstream(dir + "/token") << "s3cret-token\n";
  Cluster c({"--api-token-file", dir + "/token"}, "tcp://0.0.0.0:0");
  REQUIRE(c.ready());
  std::string ep = "tcp://127.0.0.1:" + c.api().substr(c.api().rfind(':') + 1);
  troupe::coord::ClientOptions o;
  o.endpoint = ep;
  CHECK(troupe::coord::api_call(o, {{"op", "list"}})["error"] == "unauthorized");
  o.token = "wrong";
  CHECK(troupe::coord::api_call(o, {{"op", "list"}})["error"] == "unauthorized");
  o.token = "s3cret-token";
  CHECK(troupe::coord::api_call(o, {{"op", "list"}})["ok"] == true);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Ctrl-C stops the coordinator, agents and workers follow, no orphans", "[control][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  // The agent waits a second for a coordinator to come back, then gives up.
  Proc& agent = c.add_agent("cpu:1", {"--reconnect-timeout", "1"});
  REQUIRE(c.wait_devices(1));
  std::string job = c.call({{"op", "submit"}, {"spec", tiny_spec("sigint", kEndlessSteps)}})["job"];
  REQUIRE(c.wait_state(job, [](const json& s) { return s["steps_done"] > 0; }));
  int worker = worker_pids(c.status(job))[0];
  c.coordinator().signal(SIGINT);
  CHECK(c.coordinator().wait(30s) == 130);
  CHECK(agent.wait(30s) == 1);
  CHECK(agent.output().find("lost the coordinator") != std::string::npos);
  CHECK(agent.output().find("giving up") != std::string::npos);
  CHECK(wait_until([&] { return !process_alive(worker); }, 10s));
}

namespace {
// Debian's interpreter, which has python3-zmq, even when another python3 comes first on PATH.
std::string python() { return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }
}  // namespace

TEST_CASE("the Python example of docs/api.md runs against a live coordinator", "[control][api][python]") {
  std::string doc = read_file(std::string(TROUPE_SOURCE_DIR) + "/docs/api.md");
  auto start = doc.find("```python\n");
  REQUIRE(start != std::string::npos);
  start += 10;
  auto end = doc.find("```", start);
  REQUIRE(end != std::string::npos);
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  std::ofstream(c.dir() + "/example.py") << doc.substr(start, end - start);
  std::ofstream(c.dir() + "/job.yaml") << tiny_spec("from-python", 4);
  std::string cmd = "cd " + c.dir() + " && TROUPE_API=" + c.api() + " TROUPE_API_TOKEN=" + c.token() +
                    " timeout 60 " + python() + " example.py job.yaml > " + c.dir() + "/py.log 2>&1";
  int rc = std::system(cmd.c_str());
  std::string out = read_file(c.dir() + "/py.log");
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("succeeded") != std::string::npos);
  CHECK(out.find("step 3") != std::string::npos);
}

namespace {

// Established TCP connections whose local port is `port`, as /proc/net/tcp lists them: the
// accepted ends of a listener's connections (every process of a test shares one network).
int established_to(uint16_t port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    auto colon = local.find(':');
    if (colon != std::string::npos && state == "01" &&
        std::stoul(local.substr(colon + 1), nullptr, 16) == port)
      ++n;
  }
  return n;
}

// The losses of a job's first `steps` steps (metrics.jsonl).
std::vector<double> first_losses(const std::string& run_dir, size_t steps) {
  std::vector<double> out;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  for (std::string line; out.size() < steps && std::getline(metrics, line);)
    out.push_back(json::parse(line)["loss"].get<double>());
  return out;
}

}  // namespace

TEST_CASE(
    "workers reach the coordinator through their agent (one connection per host), or with --no-relay "
    "each by itself, and train the same numbers",
    "[control][multiprocess]") {
  std::vector<double> losses[2];
  for (bool relay : {true, false}) {
    INFO((relay ? "through the agent's relay" : "--no-relay"));
    Cluster c;
    REQUIRE(c.ready());
    Proc& agent = relay ? c.add_agent("cpu:2") : c.add_agent("cpu:2", {"--no-relay"});
    REQUIRE(c.wait_devices(2));
    std::string spec = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml");
    spec.replace(spec.find("steps: 10"), 9, "steps: " + std::to_string(kEndlessSteps));
    std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
    REQUIRE(!job.empty());
    REQUIRE(c.wait_state(job, [](const json& s) { return s["state"] == "running" && s["steps_done"] >= 6; }));
    const std::string listen = c.listen();
    const auto port = static_cast<uint16_t>(std::stoul(listen.substr(listen.rfind(':') + 1)));
    // The agent's connection, and with --no-relay each worker's.
    CHECK(established_to(port) == (relay ? 1 : 3));
    CHECK((agent.output().find("workers reach the coordinator through the relay hub at 127.0.0.1:") !=
           std::string::npos) == relay);
    const std::string run_dir = c.status(job)["run_dir"];
    for (int r = 0; r < 2; ++r)
      CHECK(
          (read_file(run_dir + "/workers/" + std::to_string(r) + ".log").find("through its agent's relay") !=
           std::string::npos) == relay);
    losses[relay ? 0 : 1] = first_losses(run_dir, 6);
    c.call({{"op", "cancel"}, {"job", job}});
  }
  REQUIRE(losses[0].size() == 6);
  CHECK(losses[0] == losses[1]);
}
