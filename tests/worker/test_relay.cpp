// An agent's relay (worker/relay.hpp) against a real coordinator process: the agent is the real
// agent actor in this process, with a launcher that starts no process but keeps each launch's
// request (its token), so that this test can be each worker: it registers ranks through their
// relays as a worker process would, then tries to make one rank's relay speak for another.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "actors/system.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"
#include "worker/agent.hpp"
#include "worker/relay.hpp"

// Every actor system of this process is a node of its own, as each process is: CAF 0.17.6
// builds a node id from the host id and caf::detail::get_process_id(), which libcaf_core calls
// through its PLT, so this definition takes its place (bench/scale/node_ids.cpp does the same).
// A test may make the actor systems it builds meanwhile take a given process id (an impostor).
std::atomic<int64_t> forced_process_id{-1};
namespace caf::detail {
unsigned get_process_id() {
  static std::atomic<uint32_t> next{0};
  const int64_t forced = forced_process_id.load();
  if (forced >= 0) return static_cast<unsigned>(forced);
  return 0x80000000u | (next.fetch_add(1) & 0xfffffu);
}
}  // namespace caf::detail

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// Starts nothing: keeps the requests and the relay address the agent handed over.
class KeepingLauncher : public worker::WorkerLauncher {
 public:
  int32_t start(const LaunchRequest& r, const std::string& relay) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(r);
    relay_ = relay;
    return 4000000 + static_cast<int32_t>(requests_.size());
  }
  void kill(int32_t) override {}
  std::vector<Ended> reap(bool) override { return {}; }
  std::vector<LaunchRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::string relay() {
    std::lock_guard<std::mutex> lock(mu_);
    return relay_;
  }

 private:
  std::mutex mu_;
  std::vector<LaunchRequest> requests_;
  std::string relay_;
};

// A worker's node: its own actor system, its relay, and the one actor that registers and
// asks (the relay serves the actor that registered while it lives: it is the worker).
struct WorkerNode {
  NodeConfig cfg;
  caf::actor_system sys;
  caf::scoped_actor me;
  coordinator_actor relay;
  WorkerNode(const std::string& secret, const std::string& hub, const std::string& token)
      : cfg(secret), sys(cfg), me(sys) {
    auto r = worker::connect_relay(sys, hub, token);
    REQUIRE(r);
    relay = *r;
  }
  template <class R, class... Ts>
  std::optional<R> ask(Ts&&... xs) {
    std::optional<R> out;
    me->request(relay, 30s, std::forward<Ts>(xs)...)
        .receive([&](R& r) { out = std::move(r); }, [&](caf::error&) {});
    return out;
  }
};

// A coordinator process, this process's agent of two CPUs (its relay hub on loopback), a job
// of two ranks placed on it, and each rank registered through a relay of its own with its
// launch's token, as its worker process would.
struct RelayedJob {
  Cluster c;
  NodeConfig agent_cfg{c.secret()};
  caf::actor_system agent_sys{agent_cfg};
  std::shared_ptr<KeepingLauncher> launcher = std::make_shared<KeepingLauncher>();
  agent_actor agent;
  // However the test ends, the agent (and with it its hub and relays) goes before its system.
  struct Stop {
    agent_actor* a;
    ~Stop() {
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    }
  } stop{&agent};
  std::string job, hub;
  std::unique_ptr<WorkerNode> node[2];

  RelayedJob() {
    REQUIRE(c.ready());
    const auto [host, port] = parse_host_port(c.listen());
    auto coord = connect<coordinator_actor>(agent_sys, host, port);
    REQUIRE(coord);
    worker::AgentActorOptions ao;
    ao.devices = {"cpu:0", "cpu:1"};
    ao.secret_file = c.secret();
    ao.launcher = launcher;
    agent = worker::spawn_agent(agent_sys, *coord, ao);
    REQUIRE(c.wait_devices(2));
    std::string spec = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml");
    job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
    REQUIRE(!job.empty());
    REQUIRE(wait_until([&] { return launcher->requests().size() == 2; }, 30s));
    hub = launcher->relay();
    REQUIRE(hub.rfind("127.0.0.1:", 0) == 0);
    for (const auto& r : launcher->requests()) {
      REQUIRE((r.rank == 0 || r.rank == 1));
      node[r.rank] = std::make_unique<WorkerNode>(c.secret(), hub, r.token);
      WorkerHello h{kProtocolVersion, r.job_id, r.generation, r.rank, 4242, "relay-test", r.token};
      auto a = node[r.rank]->ask<Assignment>(reg_worker_atom::value, h);
      REQUIRE(a);
      CHECK(a->refused == "");
      CHECK(a->rank == r.rank);
    }
  }
};

// An insider holding the secret: a node of its own, connected to the coordinator and to the
// agent's hub, which gives it a handle on an actor of the agent's node (the node rank 0's and
// rank 1's relays speak from); it watches its connection to the coordinator.
struct Insider {
  NodeConfig cfg;
  caf::actor_system sys;
  coordinator_actor coord;
  relay_hub_actor hub;
  caf::scoped_actor self;
  explicit Insider(RelayedJob& r) : cfg(r.c.secret()), sys(cfg), self(sys) {
    const auto [host, port] = parse_host_port(r.c.listen());
    auto c = connect<coordinator_actor>(sys, host, port);
    REQUIRE(c);
    coord = *c;
    const auto [hub_host, hub_port] = parse_host_port(r.hub);
    auto h = connect<relay_hub_actor>(sys, hub_host, hub_port);
    REQUIRE(h);
    hub = *h;
    self->monitor(coord);
  }
  // Whether the connection to the coordinator closed within 30 s.
  bool cut_off() {
    bool closed = false;
    self->receive([&](caf::down_msg&) { closed = true; }, caf::after(30s) >> [] {});
    return closed;
  }
};

// The coordinator lives and the job runs on in generation 0, untouched, and rank `rank` still
// reaches its store through its relay.
void check_untouched(RelayedJob& r, int rank) {
  CHECK(process_alive(r.c.coordinator_pid()));
  auto st = r.c.status(r.job);
  REQUIRE(st.is_object());
  CHECK(st["failures"].empty());
  CHECK(st["generation"] == 0);
  CHECK(st["state"] != "failed");
  auto sv = r.node[rank]->ask<StoreValue>(store_set_atom::value, StoreKey{r.job, 0, "g", "after"},
                                          std::string("v"));
  REQUIRE(sv);
  CHECK(sv->error == "");
}

// Rank 1's report that it failed, as its worker would send it.
WorkerResult rank1_failed(const std::string& job, const std::string& said_by) {
  WorkerResult failed;
  failed.job_id = job;
  failed.rank = 1;
  failed.ok = false;
  failed.error_name = "engine_error";
  failed.message = "said by " + said_by;
  return failed;
}

}  // namespace

TEST_CASE("relay: a worker's relay speaks for the rank the coordinator assigned it and no other",
          "[worker][relay][multiprocess]") {
  RelayedJob r;
  auto& c = r.c;
  auto& node = r.node;
  const std::string job = r.job;
  // A relay registers one worker, once.
  WorkerHello again{kProtocolVersion, job, 0, 0, 4242, "relay-test", "00112233445566778899aabbccddeeff"};
  auto twice = node[0]->ask<Assignment>(reg_worker_atom::value, again);
  REQUIRE(twice);
  CHECK(twice->refused.find("registered once") != std::string::npos);

  // Rank 0's relay does not carry rank 1's failure: the coordinator would take it (both ranks
  // speak from the agent's node), the relay does not pass it on.
  WorkerResult failed = rank1_failed(job, "rank 0");
  auto done = node[0]->ask<bool>(worker_done_atom::value, failed);
  REQUIRE(done);
  CHECK(*done == false);
  // Nor a store request of another generation, nor rank 1's checkpoint report.
  auto sv = node[0]->ask<StoreValue>(store_set_atom::value, StoreKey{job, 7, "g", "k"}, std::string("v"));
  REQUIRE(sv);
  CHECK(sv->error == "not a rank of this job generation on this host");
  CkptShard shard{job, 0, 1, 2, 3, "", 1, "{}", {}};
  auto committed = node[0]->ask<CkptCommitted>(ckpt_shard_atom::value, shard);
  REQUIRE(committed);
  CHECK(!committed->ok);
  CHECK(committed->error == "not a rank of this job generation on this host");
  // Its own rank's store requests go through.
  sv = node[0]->ask<StoreValue>(store_set_atom::value, StoreKey{job, 0, "g", "k"}, std::string("v"));
  REQUIRE(sv);
  CHECK(sv->error == "");
  auto got = node[1]->ask<StoreValue>(store_get_atom::value, StoreKey{job, 0, "g", "k"}, int64_t{5000});
  REQUIRE(got);
  CHECK(got->found);
  CHECK(got->value == "v");

  // The coordinator's "where" polls reach each worker through its relay, and the answers it.
  for (int r = 0; r < 2; ++r) {
    bool asked = false;
    node[r]->me->receive(
        [&](where_atom) -> std::string {
          asked = true;
          return "step 3: rank " + std::to_string(r);
        },
        caf::after(30s) >> [] {});
    CHECK(asked);
  }
  CHECK(c.wait_state(job, [](const json& s) {
    return s["workers"][0]["where"] == "step 3: rank 0" && s["workers"][1]["where"] == "step 3: rank 1";
  }));

  // The job saw no failure: rank 1's false report never reached it.
  auto st = c.status(job);
  CHECK(st["failures"].empty());
  CHECK(st["generation"] == 0);

  // Rank 1's own failure, through its own relay, is taken: the job fails over to generation 1.
  failed = rank1_failed(job, "rank 1");
  done = node[1]->ask<bool>(worker_done_atom::value, failed);
  REQUIRE(done);
  CHECK(*done == true);
  CHECK(c.wait_state(job, [](const json& s) { return !s["failures"].empty(); }));
  auto failures = c.status(job)["failures"];
  REQUIRE(!failures.empty());
  CHECK(failures[0]["rank"] == 1);
}

TEST_CASE("relay: the hub hands out a relay only for a live launch's token, one at a time",
          "[worker][relay][security][multiprocess]") {
  RelayedJob r;
  Insider in(r);
  auto relay_for = [&](const std::string& token) {
    std::optional<coordinator_actor> out;
    in.self->request(in.hub, 30s, relay_atom::value, token)
        .receive([&](coordinator_actor& a) { out = a; }, [&](caf::error&) {});
    return out;
  };
  // A peer holding the secret but no launch's token gets nothing, however often it asks: the
  // agent holds no relay for it.
  CHECK_FALSE(relay_for(""));
  CHECK_FALSE(relay_for(std::string(300, 'a')));
  for (int i = 0; i < 200; ++i) CHECK_FALSE(relay_for("not-a-token-" + std::to_string(i)));
  // A live launch's token whose worker holds its relay: not a second one.
  std::string token0;
  for (const auto& q : r.launcher->requests())
    if (q.rank == 0) token0 = q.token;
  REQUIRE(!token0.empty());
  CHECK_FALSE(relay_for(token0));
  check_untouched(r, 0);
  check_untouched(r, 1);
  // Rank 0's worker goes: its relay ends with it, and its launch (still live: the agent has
  // not reaped it) may have one again.
  r.node[0].reset();
  CHECK(wait_until([&] { return relay_for(token0).has_value(); }, 30s));
}

TEST_CASE("relay: a peer that names another node as a message's source is cut off, as no troupe node routes",
          "[worker][relay][security][multiprocess]") {
  RelayedJob r;
  // This process's nodes have handled their messages through the guard (actors/basp_guard.cpp).
  CHECK(basp_guard_called());
  Insider in(r);
  // It sends rank 1's failure to the coordinator as if the agent's hub had sent it: CAF makes
  // that a routed message whose stated source is the agent's node.
  caf::actor_cast<caf::abstract_actor*>(in.coord)->enqueue(
      caf::make_mailbox_element(caf::actor_cast<caf::strong_actor_ptr>(in.hub), caf::make_message_id(), {},
                                worker_done_atom::value, rank1_failed(r.job, "an insider")),
      nullptr);
  // The coordinator closes the connection it came on, and takes nothing from it.
  CHECK(in.cut_off());
  CHECK(r.c.coordinator().output().find("closed a control connection that sent a routed message") !=
        std::string::npos);
  check_untouched(r, 1);
}

TEST_CASE("relay: a peer that introduces itself as a connected node is cut off, and speaks for no rank",
          "[worker][relay][security][multiprocess]") {
  RelayedJob r;
  // An impostor holding the secret takes the agent's node id and connects to the coordinator:
  // CAF would take its connection as the agent's second one, and what it sends as from the node
  // rank 1's relay speaks from. A CAF node id is a host id whose last byte counts the actor
  // systems of the process, and a process id: guessable, not secret. Here the impostor takes
  // the agent's process id and waits for the count to come round to the agent's byte.
  const std::string agent_node = caf::to_string(r.agent_sys.node());  // "HOSTID#PID"
  const auto hash = agent_node.find('#');
  const int agent_byte = std::stoi(agent_node.substr(hash - 2, 2), nullptr, 16);
  for (int i = 0; i < 300; ++i) {
    caf::actor_system_config pc;
    pc.load<caf::io::middleman>();  // a node id is made for a networked system only
    pc.set("scheduler.max-threads", size_t{1});
    pc.set("logger.console", caf::atom("none"));
    caf::actor_system probe{pc};
    const std::string n = caf::to_string(probe.node());
    REQUIRE(n.find('#') != std::string::npos);
    if (std::stoi(n.substr(n.find('#') - 2, 2), nullptr, 16) == (agent_byte + 255) % 256) break;
  }
  forced_process_id.store(std::stoll(agent_node.substr(hash + 1)));
  NodeConfig cfg(r.c.secret());
  caf::actor_system sys{cfg};
  forced_process_id.store(-1);
  INFO(caf::to_string(sys.node()) << " posing as " << agent_node);
  REQUIRE(sys.node() == r.agent_sys.node());
  const auto [host, port] = parse_host_port(r.c.listen());
  auto coord = connect<coordinator_actor>(sys, host, port);
  if (coord) {  // the connection may be refused at once or closed right after
    caf::scoped_actor self{sys};
    self->send(*coord, worker_done_atom::value, rank1_failed(r.job, "an impostor"));
  }
  CHECK(r.c.coordinator().says("a handshake as a node connected over another connection"));
  // The agent keeps its connection and its job: rank 1 did not fail, the job runs on.
  check_untouched(r, 0);
}

TEST_CASE("relay: a peer that sends an exit, a down or a link as a message is cut off, and nothing ends",
          "[worker][relay][security][multiprocess]") {
  RelayedJob r;
  // Each kind from an insider of its own, holding the secret: CAF would take each as a system
  // message. An exit with exit_reason::kill ends any actor, whatever its exit handler; a down
  // naming the agent's hub (an actor of the node rank 0 and 1 speak from) is a death notice;
  // a link makes the coordinator end with an exit when the insider disconnects.
  const char* kinds[] = {"exit", "down", "link"};
  for (const char* kind : kinds) {
    INFO(kind);
    Insider in(r);
    auto target = caf::actor_cast<caf::actor>(in.coord);
    if (std::string(kind) == "exit") {
      caf::anon_send_exit(target, caf::exit_reason::kill);
    } else if (std::string(kind) == "down") {
      caf::anon_send(target, caf::down_msg{caf::actor_cast<caf::actor_addr>(in.hub), caf::exit_reason::kill});
    } else {
      in.self->link_to(target);
    }
    CHECK(in.cut_off());
  }
  CHECK(
      r.c.coordinator().says("closed a control connection that sent an exit, down, link or stream message"));
  // The coordinator lives, its job runs on in generation 0, and a rank still reaches its store.
  check_untouched(r, 1);
}

TEST_CASE(
    "agent: asked where its host's workers are, it answers for each in one reply, not for a hung one or "
    "another node's, and only to its coordinator, and it passes an abort for them on to its own node's",
    "[worker][relay][security]") {
  // Two nodes of this process, never connected: the agent's, where its coordinator (a stand-in
  // that welcomes it) and its host's workers live, and another.
  auto config = [] {
    auto c = std::make_unique<caf::actor_system_config>();
    c->load<caf::io::middleman>();  // a node id is made for a networked system only
    c->add_message_type<WhereAnswers>("troupe::WhereAnswers");
    c->add_message_type<std::vector<worker_actor>>("std::vector<troupe::worker_actor>");
    c->set("scheduler.max-threads", size_t{2});
    c->set("logger.console", caf::atom("none"));
    return c;
  };
  auto here_cfg = config(), there_cfg = config();
  caf::actor_system here{*here_cfg}, there{*there_cfg};
  REQUIRE(here.node() != there.node());
  auto coordinator = here.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](reg_agent_atom, const AgentHello&) { return Welcome{true, "", kProtocolVersion}; }};
  });
  // The aborts the workers take: the one the agent should pass on, and any other.
  auto aborts = std::make_shared<std::atomic<int>>(0), wrong = std::make_shared<std::atomic<int>>(0);
  auto count = [aborts, wrong](int32_t generation, const std::string& why) {
    ++*(generation == 7 && why == "rank 9 died" ? aborts : wrong);
  };
  auto answering = [count](caf::actor_system& sys, std::string said,
                           std::shared_ptr<std::atomic<int>> asked) {
    return caf::actor_cast<worker_actor>(sys.spawn([said, asked,
                                                    count](caf::event_based_actor*) -> caf::behavior {
      return {[said, asked](where_atom) {
                ++*asked;
                return said;
              },
              [count](abort_atom, int32_t generation, const std::string& why) { count(generation, why); }};
    }));
  };
  auto asked = std::make_shared<std::atomic<int>>(0), asked_there = std::make_shared<std::atomic<int>>(0);
  worker_actor forward = answering(here, "step 3: forward layer 1", asked);
  worker_actor reduce = answering(here, "step 3: allreduce (dp)", asked);
  worker_actor elsewhere = answering(there, "step 3: elsewhere", asked_there);
  // A rank that hangs: it takes the question and never answers.
  worker_actor hung =
      caf::actor_cast<worker_actor>(here.spawn([count](caf::event_based_actor* self) -> caf::behavior {
        return {[self](where_atom) { return self->make_response_promise(); },
                [count](abort_atom, int32_t generation, const std::string& why) { count(generation, why); }};
      }));

  worker::AgentActorOptions ao;
  ao.devices = {"cpu:0"};
  ao.relay = false;
  ao.launcher = std::make_shared<KeepingLauncher>();
  std::atomic<bool> registered{false};
  ao.on_registered = [&] { registered = true; };
  agent_actor agent = worker::spawn_agent(here, caf::actor_cast<coordinator_actor>(coordinator), ao);
  REQUIRE(wait_until([&] { return registered.load(); }, 30s));

  auto ask = [&](caf::actor_system& from, std::vector<worker_actor> ws) {
    caf::scoped_actor me{from};
    std::optional<WhereAnswers> out;
    me->request(agent, 30s, where_atom::value, std::move(ws))
        .receive([&](WhereAnswers& a) { out = std::move(a); }, [&](caf::error&) {});
    return out;
  };
  // From an actor of its coordinator's node: one reply for all, in the order asked.
  auto a = ask(here, {forward, hung, elsewhere, reduce});
  REQUIRE(a);
  REQUIRE(a->answered.size() == 4);
  REQUIRE(a->where.size() == 4);
  CHECK(a->answered == std::vector<uint8_t>{1, 0, 0, 1});
  CHECK(a->where[0] == "step 3: forward layer 1");
  CHECK(a->where[1] == "");
  CHECK(a->where[2] == "");
  CHECK(a->where[3] == "step 3: allreduce (dp)");
  CHECK(*asked == 2);
  // Another node's worker was not even asked: an agent speaks only for its own host.
  CHECK(*asked_there == 0);
  // An empty question has an empty answer.
  auto none = ask(here, {});
  REQUIRE(none);
  CHECK(none->answered.empty());
  // Anyone else is refused, and so is a question naming more than a host's share.
  CHECK_FALSE(ask(there, {forward}));
  CHECK_FALSE(ask(here, std::vector<worker_actor>(kMaxWhereBatch + 1, forward)));
  CHECK(*asked == 2);

  // An abort for the host's workers: from another node, or naming more than a host's share,
  // it goes nowhere; from the coordinator's node, to each of this node's (the hung one too: it
  // is still told), not to another node's.
  auto tell = [&](caf::actor_system& from, std::vector<worker_actor> ws, const char* why) {
    caf::scoped_actor me{from};
    me->send(agent, abort_atom::value, int32_t{7}, std::string(why), std::move(ws));
  };
  tell(there, {forward, reduce}, "from another node");
  tell(here, std::vector<worker_actor>(kMaxWhereBatch + 1, forward), "too many");
  tell(here, {forward, elsewhere, hung, reduce}, "rank 9 died");
  REQUIRE(wait_until([&] { return aborts->load() >= 3; }, 30s));
  // The agent takes its messages in order and passes each on to a worker in order: a refused
  // one passed on would have come before these. And had the other node's worker been told,
  // that came before its answer to this question.
  caf::scoped_actor sync{there};
  sync->request(elsewhere, 30s, where_atom::value).receive([](std::string&) {}, [](caf::error&) {});
  CHECK(aborts->load() == 3);
  CHECK(wrong->load() == 0);

  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  for (const caf::actor& x :
       {caf::actor_cast<caf::actor>(forward), caf::actor_cast<caf::actor>(reduce),
        caf::actor_cast<caf::actor>(elsewhere), caf::actor_cast<caf::actor>(hung), coordinator})
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
}

TEST_CASE("relay: a host's step reports go on together through its step batcher, the last before a result",
          "[worker][relay][multiprocess]") {
  RelayedJob r;
  auto& c = r.c;
  const std::string job = r.job;
  const auto [host, port] = parse_host_port(c.listen());
  auto coord = connect<coordinator_actor>(r.agent_sys, host, port);
  REQUIRE(coord);
  // Steps of ten hours: a report may wait the whole window (a tenth of its step, at most).
  auto report = [&](int32_t rank, int64_t step, double step_ms = 3.6e7) {
    StepMetrics m;
    m.job_id = job;
    m.rank = rank;
    m.step = step;
    m.loss = 5.0 - 0.001 * static_cast<double>(step);
    m.lr = 1e-3;
    m.tokens = 64;
    m.step_ms = step_ms;
    m.grad_norm = 1;
    return m;
  };
  auto steps_done = [&] { return c.status(job)["steps_done"].get<int64_t>(); };

  // A batcher of the agent's node (the node both ranks registered from) whose window never
  // closes in this test: it sends what it holds only when flushed or full.
  auto batcher = worker::start_step_batcher(r.agent_sys, *coord, std::chrono::hours(1));
  caf::scoped_actor me{r.agent_sys};
  me->send(batcher, step_atom::value, report(0, 0));
  me->send(batcher, step_atom::value, report(1, 0));
  auto flush = [&](caf::scoped_actor& from) {
    std::optional<bool> out;
    from->request(batcher, 30s, flush_atom::value).receive([&](bool b) { out = b; }, [&](caf::error&) {});
    return out;
  };
  // Another node may neither flush it nor hand it steps.
  auto refused = flush(r.node[0]->me);
  REQUIRE(refused);
  CHECK_FALSE(*refused);
  r.node[0]->me->send(batcher, step_atom::value, report(0, 1));
  r.node[0]->me->send(batcher, step_atom::value, report(1, 1));
  std::this_thread::sleep_for(300ms);
  CHECK(steps_done() == 0);  // held: the window is an hour
  auto flushed = flush(me);
  REQUIRE(flushed);
  CHECK(*flushed);
  CHECK(c.wait_state(job, [](const json& s) { return s["steps_done"] == 1; }));

  // A full batch goes at once: kMaxStepBatch reports, both ranks' steps 1 to kMaxStepBatch / 2
  // (step 1 for the first time: the other node's never went on).
  const auto half = static_cast<int64_t>(kMaxStepBatch / 2);
  for (int64_t s = 1; s <= half; ++s) {
    me->send(batcher, step_atom::value, report(0, s));
    me->send(batcher, step_atom::value, report(1, s));
  }
  CHECK(c.wait_state(job, [half](const json& s) { return s["steps_done"] == half + 1; }));
  CHECK(c.status(job)["loss"].get<double>() == Approx(5.0 - 0.001 * static_cast<double>(half)));
  // A report of a 4 ms step waits 0.4 ms at most, however long the window.
  me->send(batcher, step_atom::value, report(0, half + 1, 4));
  me->send(batcher, step_atom::value, report(1, half + 1, 4));
  CHECK(c.wait_state(job, [half](const json& s) { return s["steps_done"] == half + 2; }));

  // The coordinator refuses a batch larger than a host's share, unread.
  me->send(*coord, steps_atom::value, std::vector<StepMetrics>(kMaxStepBatch + 1, report(0, half + 2)));
  CHECK(c.coordinator().says("a batch of " + std::to_string(kMaxStepBatch + 1)));
  CHECK(steps_done() == half + 2);

  // Through the relays (the agent's own batcher, its 50 ms window): each rank reports its last
  // step, then its result at once. The job ends with the second result, and a step that came
  // after it would count for nothing: the relay has the batcher flush before it passes a result on.
  for (int rank = 0; rank < 2; ++rank)
    r.node[rank]->me->send(r.node[rank]->relay, step_atom::value, report(rank, half + 2));
  for (int rank = 0; rank < 2; ++rank) {
    WorkerResult ok;
    ok.job_id = job;
    ok.rank = rank;
    ok.ok = true;
    auto done = r.node[rank]->ask<bool>(worker_done_atom::value, ok);
    REQUIRE(done);
    CHECK(*done);
  }
  REQUIRE(c.wait_state(job, "succeeded"));
  CHECK(steps_done() == half + 3);
  caf::anon_send_exit(batcher, caf::exit_reason::user_shutdown);
}
