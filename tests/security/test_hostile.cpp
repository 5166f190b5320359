// Hostile peers on loopback against real coordinator, agent and worker
// processes: strangers without the cluster secret, insiders that hold it but
// speak for what they are not, malformed bytes on both ports, and a pause.
// Every test ends by showing that the job it disturbed trains on untouched.
#include <signal.h>

#include <catch2/catch.hpp>
#include <random>
#include <zmq.hpp>

#include "actors/secret.hpp"
#include "core/text.hpp"
#include "tests/control/cluster.hpp"
#include "tests/security/peer.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// Rank 0 of generation 0 reporting its end: ok, or failed with `cause` ("fake").
actors::WorkerResult result_of(const std::string& job, bool ok, const std::string& cause) {
  actors::WorkerResult r;
  r.job_id = job;
  r.ok = ok;
  r.error_name = cause;
  r.message = ok ? "" : "fake";
  return r;
}

// An endless job of `dp` ranks that saves a checkpoint every 20 steps.
std::string endless_spec(const std::string& name, int dp) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
  };
  replace("name: tiny-dp2-pp1-tp1", "name: " + name);
  replace("steps: 10", "steps: " + std::to_string(testing::kEndlessSteps));
  replace("data: 2", "data: " + std::to_string(dp));
  return s + "\ncheckpoint:\n  every: 20\n  keep: 3\nfault:\n  max_restarts: 5\n";
}

// The job trains: `more` steps past where it is now, in the same generation, with no failure.
bool trains_on(Cluster& c, const std::string& job, int64_t more = 5) {
  auto before = c.status(job);
  if (!before.is_object()) return false;
  const int64_t from = before["steps_done"];
  const int gen = before["generation"];
  return c.wait_state(job, [&](const json& s) {
    return s["state"] == "running" && s["generation"] == gen && s["steps_done"].get<int64_t>() >= from + more;
  });
}

// A cluster of one coordinator, one agent of `devices` cpus and an endless job on them.
struct Busy {
  Cluster c;
  std::string job;
  explicit Busy(int devices = 1) {
    REQUIRE(c.ready());
    c.add_agent("cpu:" + std::to_string(devices));
    REQUIRE(c.wait_devices(devices));
    job = c.call({{"op", "submit"}, {"spec", endless_spec("victim", devices)}})["job"];
    REQUIRE(!job.empty());
    REQUIRE(c.wait_state(job, [](const json& s) { return s["state"] == "running" && s["steps_done"] > 2; }));
  }
  ~Busy() { c.call({{"op", "cancel"}, {"job", job}}); }
  void untouched() {
    CHECK(process_alive(c.coordinator_pid()));
    auto s = c.status(job);
    CHECK(s["restarts"] == 0);
    CHECK(s["failures"].empty());
    CHECK(s["generation"] == 0);
    CHECK(c.call({{"op", "list"}})["agents"].size() == 1);
    CHECK(trains_on(c, job));
  }
};

std::string zmq_exchange(const std::string& endpoint, const std::string& bytes) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::req);
  s.set(zmq::sockopt::rcvtimeo, 10000);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  s.send(zmq::buffer(bytes), zmq::send_flags::none);
  zmq::message_t m;
  if (!s.recv(m)) return "";
  return m.to_string();
}

}  // namespace

TEST_CASE("hostile: an API request that is not UTF-8 gets bad_request, the coordinator serves on",
          "[security][api][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  for (std::string bad :
       {std::string("{\"op\":\"\xff\"}"), std::string("{\"op\":\"list\",\"token\":\"\xc0\xaf\"}"),
        std::string("\xed\xa0\x80"), std::string("{\"op\":\"submit\",\"spec\":\"\xf4\x90\x80\x80\"}")}) {
    INFO("request bytes: " << json(sanitize_utf8(bad)).dump());
    auto reply = json::parse(zmq_exchange(c.api(), bad), nullptr, false);
    REQUIRE(reply.is_object());
    CHECK(reply["ok"] == false);
    CHECK(reply["error"] == "bad_request");
    CHECK(reply["message"].get<std::string>().find("UTF-8") != std::string::npos);
  }
  // Random bytes, each answered with a JSON object.
  std::mt19937 rng(12);
  for (int i = 0; i < 200; ++i) {
    std::string junk(rng() % 64, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    auto reply = json::parse(zmq_exchange(c.api(), junk), nullptr, false);
    REQUIRE(reply.is_object());
    CHECK(reply["ok"] == false);
  }
  CHECK(process_alive(c.coordinator_pid()));
  CHECK(c.call({{"op", "list"}})["ok"] == true);
}

TEST_CASE(
    "hostile: API requests nested a million deep, bombs of empty objects and keys twice are refused by name",
    "[security][api][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  std::string objects = "{\"op\":\"list\",\"x\":[";
  for (int i = 0; i < 1000000; ++i) objects += i ? ",{}" : "{}";
  objects += "]}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"op\":\"list\",\"x\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}",
       "JSON nested deeper than 16 levels"},
      {std::string(10 << 20, '['), "JSON nested deeper than 16 levels"},
      {objects, "the JSON would take more than"},
      {R"({"op":"list","op":"status"})", "the key \"op\" appears twice"},
  };
  for (const auto& [text, expect] : cases) {
    auto reply = json::parse(zmq_exchange(c.api(), text), nullptr, false);
    INFO(reply.dump());
    REQUIRE(reply.is_object());
    CHECK(reply["error"] == "bad_json");
    CHECK(reply["message"].get<std::string>().find(expect) != std::string::npos);
  }
  CHECK(process_alive(c.coordinator_pid()));
  CHECK(c.call({{"op", "list"}})["ok"] == true);
  // Over the message limit (16 MiB): the connection is dropped before the bytes are kept.
  const long before = peak_rss_kib(c.coordinator_pid());
  CHECK(zmq_exchange(c.api(), std::string(20 << 20, '[')).empty());
  CHECK(peak_rss_kib(c.coordinator_pid()) < before + 8 * 1024);
  CHECK(c.call({{"op", "list"}})["ok"] == true);
}

TEST_CASE("hostile: a peer without the cluster secret gets no connection, the job trains on",
          "[security][multiprocess]") {
  Busy b;
  // Another secret: the TLS handshake fails, nothing of the coordinator is reached.
  const std::string other = b.c.dir() + "/other.pem";
  actors::write_secret(other);
  {
    Peer stranger(other);
    auto coord = stranger.connect(b.c.listen());
    CHECK(!coord);
  }
  // No TLS at all: CAF's plain BASP handshake is not TLS and is dropped.
  {
    PlainPeer plain;
    CHECK(!plain.connect(b.c.listen()));
  }
  b.untouched();
}

TEST_CASE("hostile: BASP headers that claim 4 GiB payloads cost no memory and no restart",
          "[security][multiprocess]") {
  Busy b;
  const long before = peak_rss_kib(b.c.coordinator_pid());
  REQUIRE(before > 0);
  for (uint8_t op : {1, 4, 5, 1}) CHECK(send_raw(b.c.listen(), basp_header(op, 0xFFFFFFFFu)));
  // Slow senders too: a header in pieces, then silence.
  CHECK(send_raw(b.c.listen(), basp_header(1, 0xFFFFFFFFu).substr(0, 7)));
  const long after = peak_rss_kib(b.c.coordinator_pid());
  INFO("coordinator peak RSS " << before << " KiB before, " << after << " KiB after");
  CHECK(after < before + 64 * 1024);
  b.untouched();
}

TEST_CASE("hostile: an insider with the secret cannot speak for what it is not", "[security][multiprocess]") {
  Busy b;
  Peer insider(b.c.secret());
  auto coord = insider.connect(b.c.listen());
  REQUIRE(coord);
  const std::string job = b.job;
  using namespace actors;

  // The API is served to the coordinator's own API thread only.
  auto api = insider.ask<std::string>(*coord, api_atom::value, std::string(R"({"op":"list"})"));
  REQUIRE(api);
  CHECK(json::parse(*api)["error"] == "unauthorized");

  // A fake success of rank 0 is not taken.
  auto done = insider.ask<bool>(*coord, worker_done_atom::value, result_of(job, true, ""));
  REQUIRE(done);
  CHECK(*done == false);
  // Fake metrics never reach metrics.jsonl.
  StepMetrics fake{job, 0, 0, 999999, 1234.5, 0.1, 1, 1.0, 0, false, 0, 0, 0, 0};
  caf::scoped_actor self{insider.sys()};
  self->send(*coord, step_atom::value, fake);
  // A fake exit report or failure costs no restart.
  self->send(*coord, worker_exit_atom::value, WorkerExit{job, 0, 0, 4242, 1, 0});
  // Nor does a fake report that a rank's process is stopped (only its launching agent knows).
  self->send(*coord, worker_stop_atom::value, WorkerStopped{job, 0, 0, 4242, 19, 5000});
  auto refused_result =
      insider.ask<bool>(*coord, worker_done_atom::value, result_of(job, false, "engine_error"));
  REQUIRE(refused_result);
  CHECK(*refused_result == false);

  // Registering as a rank needs the launch's token; another protocol version fails nothing.
  WorkerHello hello{kProtocolVersion, job, 0, 0, 4242, "evil", ""};
  auto a = insider.ask<Assignment>(*coord, reg_worker_atom::value, hello);
  REQUIRE(a);
  CHECK(a->refused.find("not launched with this token") != std::string::npos);
  // Nor as a hot spare: a spare's launch rank needs its launch's token as well.
  hello.rank = kFirstSpareRank;
  a = insider.ask<Assignment>(*coord, reg_worker_atom::value, hello);
  REQUIRE(a);
  CHECK(a->refused.find("not launched with this token") != std::string::npos);
  hello.rank = 0;
  hello.protocol = 99;
  hello.token = "00112233445566778899aabbccddeeff";
  a = insider.ask<Assignment>(*coord, reg_worker_atom::value, hello);
  REQUIRE(a);
  CHECK(!a->refused.empty());

  // A checkpoint report that points elsewhere deletes nothing there.
  const std::string victim = b.c.dir() + "/victim";
  for (int i = 1; i <= 3; ++i)
    std::filesystem::create_directories(victim + "/step_00000" + std::to_string(i));
  CkptShard shard{job, 0, 0, 1, 3, victim, 1, "{}", {}};
  auto committed = insider.ask<CkptCommitted>(*coord, ckpt_shard_atom::value, shard);
  REQUIRE(committed);
  CHECK(!committed->ok);
  CHECK(committed->error.find("refused") != std::string::npos);
  for (int i = 1; i <= 3; ++i) CHECK(std::filesystem::exists(victim + "/step_00000" + std::to_string(i)));
  // Path tricks in file names are refused too.
  shard.root = std::string(b.c.status(job)["run_dir"]) + "/ckpt";
  shard.files = {{"../../../escape", 1, "00"}};
  committed = insider.ask<CkptCommitted>(*coord, ckpt_shard_atom::value, shard);
  REQUIRE(committed);
  CHECK(!committed->ok);

  // The rendezvous store serves the job's ranks only.
  auto sv =
      insider.ask<StoreValue>(*coord, store_set_atom::value, StoreKey{job, 0, "g", "k"}, std::string("v"));
  REQUIRE(sv);
  CHECK(!sv->found);
  CHECK(sv->error.find("not a registered rank") != std::string::npos);

  b.untouched();
  std::ifstream metrics(std::string(b.c.status(job)["run_dir"]) + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) CHECK(line.find("1234.5") == std::string::npos);
}

TEST_CASE("hostile: a monitor or down message that names another node is refused, and kills nothing",
          "[security][multiprocess]") {
  Busy b;
  // The agent's node: this machine's host id (CAF's, as this process's own node has it) and the
  // agent's process id. The job's rank speaks through a relay, an actor of that node.
  int agent_pid = 0;
  {
    auto list = b.c.call({{"op", "list"}});
    REQUIRE(list["agents"].size() == 1);
    agent_pid = list["agents"][0].value("pid", 0);
  }
  REQUIRE(agent_pid > 0);
  Peer insider(b.c.secret());
  const std::string mine = caf::to_string(insider.sys().node());  // "HOSTID#PID"
  REQUIRE(mine.find('#') != std::string::npos);
  auto agent_node = caf::make_node_id(static_cast<uint32_t>(agent_pid), mine.substr(0, mine.find('#')));
  REQUIRE(agent_node);
  auto me = caf::make_node_id(static_cast<uint32_t>(getpid()) ^ 0x40000000u, mine.substr(0, mine.find('#')));
  REQUIRE(me);
  using caf::io::basp::message_type;
  for (const char* kind : {"down", "monitor"}) {
    INFO(kind);
    RawBaspPeer raw(insider.sys(), b.c.secret(), b.c.listen());
    caf::node_id coordinator;
    REQUIRE(raw.handshake(*me, &coordinator));
    // As the agent's node: the end of each of its first actors (CAF would take each as that
    // actor's death, and a rank's relay as its rank lost), or a monitor of them from it. The
    // first is refused and the connection closed, however many of the others were written by
    // then: a write may find it closed already.
    int sent = 0;
    for (caf::actor_id aid = 1; aid <= 64; ++aid, ++sent) {
      const bool ok = std::string(kind) == "down"
                          ? raw.send(message_type::down_message, 0, aid, 0, *agent_node, coordinator,
                                     caf::make_error(caf::exit_reason::kill))
                          : raw.send(message_type::monitor_message, 0, 0, aid, *agent_node, coordinator);
      if (!ok) break;
    }
    CHECK(sent >= 1);
    CHECK(raw.closed_by_peer());
  }
  CHECK(b.c.coordinator().says(
      "closed a control connection that sent a monitor or down message for another node"));
  b.untouched();
}

TEST_CASE("hostile: control-plane strings that are not UTF-8 or too long are refused, nothing throws",
          "[security][multiprocess]") {
  Busy b;
  Peer insider(b.c.secret());
  auto coord = insider.connect(b.c.listen());
  REQUIRE(coord);
  using namespace actors;
  for (AgentHello h : {AgentHello{kProtocolVersion, "evil\xff", 1, {"cpu:0"}},
                       AgentHello{kProtocolVersion, std::string(100000, 'h'), 1, {"cpu:0"}},
                       AgentHello{kProtocolVersion, "host", 1, {"cpu:\xc3"}},
                       AgentHello{kProtocolVersion, "host", 1, std::vector<std::string>(100000, "cpu:0")},
                       AgentHello{kProtocolVersion, "host", 1, {}}}) {
    auto w = insider.ask<Welcome>(*coord, reg_agent_atom::value, h);
    REQUIRE(w);
    CHECK(!w->accepted);
    CHECK(w->message.rfind("refused: ", 0) == 0);
  }
  // A registration without a sender (the root cause of the pause crash: a request whose
  // connection dropped before it was handled) is refused, not dereferenced.
  caf::anon_send(*coord, reg_agent_atom::value, AgentHello{kProtocolVersion, "anon", 1, {"cpu:0"}});
  caf::anon_send(*coord, reg_worker_atom::value, WorkerHello{kProtocolVersion, b.job, 0, 0, 1, "anon", ""});
  // Odd text in reports is repaired, and the where/list JSON never fails.
  auto listed = b.c.call({{"op", "list"}});
  CHECK(listed["ok"] == true);
  CHECK(listed["agents"].size() == 1);
  b.untouched();
}

TEST_CASE("hostile: a coordinator paused for 6 s (SIGSTOP, SIGCONT) serves on and its job recovers",
          "[security][multiprocess]") {
  Busy b(2);
  const int pid = b.c.coordinator_pid();
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  std::this_thread::sleep_for(6s);
  REQUIRE(::kill(pid, SIGCONT) == 0);
  // Its agent saw it silent past the heartbeat timeout and reconnected; the job restarts
  // from its checkpoint and trains on.
  CHECK(wait_until([&] { return b.c.call({{"op", "list"}})["ok"] == true; }, 30s));
  CHECK(b.c.wait_state(
      b.job, [](const json& s) { return s["state"] == "running" && s["generation"].get<int>() >= 1; }, 60s));
  CHECK(trains_on(b.c, b.job));
  CHECK(process_alive(pid));
  CHECK(b.c.coordinator().wait(0ms) == -1);  // still running: not exited, not crashed
}
