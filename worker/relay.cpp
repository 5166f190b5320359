#include "worker/relay.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <iostream>
#include <memory>
#include <tuple>
#include <vector>

#include "actors/system.hpp"

namespace troupe::worker {

namespace {

using namespace troupe::actors;

// A relay nobody registered through within this long ends (the worker gave up or died).
constexpr auto kRegisterWithin = std::chrono::seconds(90);
// How long a forwarded request waits for the coordinator beyond what the worker asked:
// the worker's own request times out first, so it never waits on the relay.
constexpr auto kForwardMargin = std::chrono::minutes(2);
// How long a relay waits for the step batcher's flush before it passes on its worker's result
// anyway (the batcher answers at once unless its node is stalled).
constexpr auto kFlushWithin = std::chrono::seconds(10);
// The identities (job, generation, rank) a relay remembers for its worker: one per generation
// it served; a message for an older one is still the coordinator's to refuse as stale.
constexpr size_t kIdentities = 16;

using Identity = std::tuple<std::string, int32_t, int32_t>;  // job, generation, rank

struct RelayState {
  coordinator_actor coordinator;
  step_batcher_actor batcher;  // the host's (invalid: steps go to the coordinator one by one)
  caf::node_id worker_node;    // the node that asked the hub for this relay
  caf::actor worker;           // the worker actor that registered through it
  bool registering = false;
  std::deque<Identity> identities;  // assigned by the coordinator, newest last
  uint64_t refused = 0;
  static inline const char* name = "troupe.relay";
};

using relay_ptr = caf::stateful_actor<RelayState>*;

// The current message's sender is an actor of `node` (a relay's, the step batcher's).
template <class Self>
bool from_node(Self self, const caf::node_id& node) {
  auto sender = self->current_sender();
  return sender && node && sender->node() == node;
}

bool from_coordinator(relay_ptr self) { return from_node(self, self->state.coordinator.node()); }

bool from_worker(relay_ptr self) { return from_node(self, self->state.worker_node); }

// The worker registered through this relay and was assigned (job, generation, rank).
bool speaks_for(relay_ptr self, const std::string& job, int32_t generation, int32_t rank) {
  if (!self->state.worker || !from_worker(self)) return false;
  const auto& ids = self->state.identities;
  return std::find(ids.begin(), ids.end(), Identity{job, generation, rank}) != ids.end();
}

// A store key of a generation the worker was assigned a rank of (not a spare's place: a spare
// has no rendezvous).
bool speaks_for_store(relay_ptr self, const StoreKey& k) {
  if (!self->state.worker || !from_worker(self)) return false;
  for (const auto& [job, generation, rank] : self->state.identities)
    if (job == k.job_id && generation == k.generation && !is_spare_rank(rank)) return true;
  return false;
}

void note_refused(relay_ptr self, const char* what) {
  auto n = ++self->state.refused;
  if (n <= 5 || n % 1000 == 0)
    std::cerr << "troupe agent: relay refused " << what << " from "
              << (self->current_sender() ? caf::to_string(self->current_sender()->node())
                                         : std::string("nobody"))
              << " (" << n << " so far)" << std::endl;
}

void remember(relay_ptr self, const Assignment& a) {
  if (!a.refused.empty()) return;
  auto& ids = self->state.identities;
  Identity id{a.job_id, a.generation, a.rank};
  if (std::find(ids.begin(), ids.end(), id) != ids.end()) return;
  ids.push_back(std::move(id));
  while (ids.size() > kIdentities) ids.pop_front();
}

// Forwards a request to the coordinator and its answer (or error) to the requester. (Every
// check of the sender comes first: making a response promise takes the sender from the message.)
template <class Answer, class... Ts>
caf::response_promise forward(relay_ptr self, caf::timespan timeout, Ts&&... xs) {
  auto rp = self->make_response_promise();
  self->request(self->state.coordinator, timeout, std::forward<Ts>(xs)...)
      .then([rp](Answer& a) mutable { rp.deliver(std::move(a)); },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

template <class T>
caf::response_promise answer(relay_ptr self, T x) {
  auto rp = self->make_response_promise();
  rp.deliver(std::move(x));
  return rp;
}

StoreValue store_refused() {
  StoreValue v;
  v.error = "not a rank of this job generation on this host";
  return v;
}

// A store request of the worker's generation goes on to the coordinator; any other is answered here.
template <class Op, class Arg>
caf::response_promise forward_store(relay_ptr self, caf::timespan timeout, Op op, StoreKey& k, Arg&& arg) {
  if (!speaks_for_store(self, k)) {
    note_refused(self, "a store request");
    return answer(self, store_refused());
  }
  return forward<StoreValue>(self, timeout, op, std::move(k), std::forward<Arg>(arg));
}

caf::timespan waiting(int64_t ms) {
  const int64_t capped = std::clamp<int64_t>(ms, 0, int64_t{24} * 3600 * 1000);
  return std::chrono::milliseconds(capped) + kForwardMargin;
}

// The worker's result goes to the coordinator after the steps the batcher holds: the flush is
// answered after the batcher sent them, and both messages leave this node on its one connection
// to the coordinator, in that order.
caf::response_promise pass_result(relay_ptr self, WorkerResult r) {
  auto rp = self->make_response_promise();
  auto pass = [self, rp, r]() mutable {
    self->request(self->state.coordinator, std::chrono::minutes(2), worker_done_atom::value, std::move(r))
        .then([rp](bool ok) mutable { rp.deliver(ok); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  };
  if (!self->state.batcher) {
    pass();
    return rp;
  }
  self->request(self->state.batcher, kFlushWithin, flush_atom::value)
      .then([pass](bool) mutable { pass(); }, [pass](caf::error&) mutable { pass(); });
  return rp;
}

caf::behavior relay_fn(relay_ptr self, caf::actor hub, coordinator_actor coordinator,
                       step_batcher_actor batcher, caf::node_id worker_node,
                       std::shared_ptr<LaunchTokens> tokens, std::string token) {
  auto& s = self->state;
  s.coordinator = coordinator;
  s.batcher = batcher;
  s.worker_node = worker_node;
  // Its launch may have a relay again (a worker that lost its own before registering).
  self->attach_functor([tokens, token](const caf::error&) { tokens->release(token); });
  self->monitor(coordinator);
  // The hub ends with its agent: so do its relays (their workers are being killed).
  self->monitor(hub);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == hub.address() || dm.source == self->state.coordinator.address() ||
        (self->state.worker && dm.source == self->state.worker.address()))
      self->quit(dm.reason);
  });
  // Anything else (another interface's message, from anyone) is dropped unanswered.
  self->set_default_handler(caf::drop);
  self->delayed_send(self, kRegisterWithin, tick_atom::value);
  return {
      [=](tick_atom) {
        const bool own = caf::actor_cast<caf::actor_addr>(self->current_sender()) == self->address();
        if (!own || self->state.worker) return;
        if (self->state.registering)  // the coordinator's answer is on its way: look again later
          self->delayed_send(self, kRegisterWithin, tick_atom::value);
        else
          self->quit(caf::exit_reason::user_shutdown);
      },
      // ---- from the worker
      [=](reg_worker_atom, WorkerHello& h) -> caf::response_promise {
        auto& st = self->state;
        if (!from_worker(self) || st.worker || st.registering) {
          note_refused(self, "a registration");
          Assignment none;
          none.refused = "this relay serves one worker, registered once";
          return answer(self, std::move(none));
        }
        st.registering = true;
        auto worker = caf::actor_cast<caf::actor>(self->current_sender());
        auto rp = self->make_response_promise();
        self->request(st.coordinator, std::chrono::seconds(60), reg_worker_atom::value, std::move(h))
            .then(
                [=](Assignment& a) mutable {
                  self->state.registering = false;
                  if (a.refused.empty() && !self->state.worker) {
                    self->state.worker = worker;
                    self->monitor(worker);
                    remember(self, a);
                  }
                  rp.deliver(std::move(a));
                },
                [=](caf::error& e) mutable {
                  self->state.registering = false;
                  rp.deliver(std::move(e));
                });
        return rp;
      },
      [=](step_atom, StepMetrics& m) {
        if (!speaks_for(self, m.job_id, m.generation, m.rank)) return note_refused(self, "a step");
        if (self->state.batcher)
          self->send(self->state.batcher, step_atom::value, std::move(m));
        else
          self->send(self->state.coordinator, step_atom::value, std::move(m));
      },
      [=](worker_done_atom, WorkerResult& r) -> caf::response_promise {
        if (!speaks_for(self, r.job_id, r.generation, r.rank)) {
          note_refused(self, "a result");
          return answer(self, false);
        }
        return pass_result(self, std::move(r));
      },
      [=](ckpt_shard_atom, CkptShard& c) -> caf::response_promise {
        if (!speaks_for(self, c.job_id, c.generation, c.rank)) {
          note_refused(self, "a checkpoint report");
          CkptCommitted no;
          no.error = "not a rank of this job generation on this host";
          return answer(self, std::move(no));
        }
        return forward<CkptCommitted>(self, std::chrono::minutes(15), ckpt_shard_atom::value, std::move(c));
      },
      [=](store_set_atom op, StoreKey& k, std::string& v) {
        return forward_store(self, waiting(0), op, k, std::move(v));
      },
      [=](store_add_atom op, StoreKey& k, int64_t delta) {
        return forward_store(self, waiting(0), op, k, delta);
      },
      [=](store_get_atom op, StoreKey& k, int64_t wait_ms) {
        return forward_store(self, waiting(wait_ms), op, k, wait_ms);
      },
      // ---- from the coordinator, to the worker (sent as this relay: the worker's coordinator)
      [=](abort_atom, int32_t generation, std::string& why) {
        // From the coordinator, or from its agent passing on an abort for every rank of the host.
        if (!(from_coordinator(self) || from_node(self, self->node())) || !self->state.worker)
          return note_refused(self, "an abort");
        self->send(self->state.worker, abort_atom::value, generation, std::move(why));
      },
      [=](drain_atom, int32_t generation, int64_t step) {
        if (!from_coordinator(self) || !self->state.worker) return note_refused(self, "a drain");
        self->send(self->state.worker, drain_atom::value, generation, step);
      },
      [=](assign_atom, Assignment& a) {
        if (!from_coordinator(self) || !self->state.worker) return note_refused(self, "an assignment");
        remember(self, a);
        self->send(self->state.worker, assign_atom::value, std::move(a));
      },
      [=](where_atom) -> caf::response_promise {
        // From the coordinator, or from its agent asking for every rank of the host at once
        // (an actor of this node). Checked before the promise is made: making it takes the
        // sender from the message.
        if (!(from_coordinator(self) || from_node(self, self->node())) || !self->state.worker) {
          note_refused(self, "a where");
          return answer(self, caf::make_error(caf::sec::unexpected_message));
        }
        auto rp = self->make_response_promise();
        self->request(self->state.worker, std::chrono::seconds(5), where_atom::value)
            .then([rp](std::string& w) mutable { rp.deliver(std::move(w)); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

struct HubState {
  coordinator_actor coordinator;
  step_batcher_actor batcher;
  std::shared_ptr<LaunchTokens> tokens;
  uint64_t refused = 0;
  static inline const char* name = "troupe.relay_hub";
};

relay_hub_actor::behavior_type hub_fn(relay_hub_actor::stateful_pointer<HubState> self,
                                      coordinator_actor coordinator, step_batcher_actor batcher,
                                      std::shared_ptr<LaunchTokens> tokens) {
  self->state.coordinator = coordinator;
  self->state.batcher = batcher;
  self->state.tokens = std::move(tokens);
  return {
      [=](relay_atom, const std::string& token) -> caf::result<coordinator_actor> {
        auto sender = self->current_sender();
        auto& st = self->state;
        if (!sender || !sender->node() || sender->node() == self->node() ||
            sender->node() == st.coordinator.node())
          return caf::make_error(caf::sec::invalid_argument);
        // Only a worker this agent launched and is running, once at a time: a peer without a
        // live launch's token gets nothing, and cannot make the agent hold relays for it.
        if (token.empty() || token.size() > 256 || !st.tokens->take(token)) {
          if (++st.refused <= 20 || st.refused % 1000 == 0)
            std::cerr << "troupe agent: refused a relay to a peer without a live launch's token ("
                      << st.refused << " so far)" << std::endl;
          return caf::make_error(caf::sec::invalid_argument, "no live launch has this token");
        }
        auto relay = self->spawn(relay_fn, caf::actor_cast<caf::actor>(self), st.coordinator, st.batcher,
                                 sender->node(), st.tokens, token);
        return caf::actor_cast<coordinator_actor>(relay);
      },
  };
}

using Clock = std::chrono::steady_clock;

struct BatcherState {
  coordinator_actor coordinator;
  std::chrono::milliseconds window{0};
  std::vector<StepMetrics> held;                     // at most kMaxStepBatch
  Clock::time_point due = Clock::time_point::max();  // when `held` goes (a tick is on its way)
  uint64_t refused = 0;
  static inline const char* name = "troupe.step_batcher";
};

using batcher_ptr = step_batcher_actor::stateful_pointer<BatcherState>;

void send_held(batcher_ptr self) {
  auto& held = self->state.held;
  self->state.due = Clock::time_point::max();
  if (held.empty()) return;
  self->send(self->state.coordinator, steps_atom::value, std::move(held));
  held = {};
}

// How long a report may wait: the window, and at most a tenth of its rank's step. The
// coordinator's picture of the job (the last step every rank completed, which the recovery
// from in-memory snapshots starts from: each rank keeps its last two) then lags by a fraction
// of a step however short the steps are; a report of a step that took no time (or says
// nonsense) goes at once.
std::chrono::microseconds may_wait(const BatcherState& st, const StepMetrics& m) {
  const double tenth_us = m.step_ms * 100.0;  // a tenth of the step, in microseconds
  if (!(tenth_us >= 1.0)) return std::chrono::microseconds(0);
  const auto window = std::chrono::duration_cast<std::chrono::microseconds>(st.window);
  if (tenth_us >= static_cast<double>(window.count())) return window;
  return std::chrono::microseconds(static_cast<int64_t>(tenth_us));
}

step_batcher_actor::behavior_type batcher_fn(batcher_ptr self, coordinator_actor coordinator,
                                             std::chrono::milliseconds window) {
  self->state.coordinator = coordinator;
  self->state.window = window;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  auto refused = [self](const char* what) {
    if (++self->state.refused <= 5 || self->state.refused % 1000 == 0)
      std::cerr << "troupe agent: the step batcher refused " << what << " from another node ("
                << self->state.refused << " so far)" << std::endl;
  };
  return {
      [=](step_atom, StepMetrics& m) {
        if (!from_node(self, self->node())) return refused("a step");
        auto& st = self->state;
        const auto wait = may_wait(st, m);
        st.held.push_back(std::move(m));
        if (st.held.size() >= kMaxStepBatch || wait.count() <= 0) return send_held(self);
        const auto due = Clock::now() + wait;
        if (due < st.due) {  // sooner than the batch was due: a tick for the new time too
          st.due = due;
          self->delayed_send(self, wait, tick_atom::value);
        }
      },
      [=](flush_atom) -> bool {
        if (!from_node(self, self->node())) {
          refused("a flush");
          return false;
        }
        send_held(self);
        return true;
      },
      [=](tick_atom) {
        // Its own, for the batch held now or for one sent since (then it is early, or finds none).
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != self->address()) return;
        if (Clock::now() >= self->state.due) send_held(self);
      },
  };
}

}  // namespace

void LaunchTokens::add(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(token, false);
}

void LaunchTokens::remove(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(token);
}

bool LaunchTokens::take(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(token);
  if (it == live_.end() || it->second) return false;
  it->second = true;
  return true;
}

void LaunchTokens::release(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = live_.find(token); it != live_.end()) it->second = false;
}

step_batcher_actor start_step_batcher(caf::actor_system& sys, const coordinator_actor& coordinator,
                                      std::chrono::milliseconds window) {
  return sys.spawn(batcher_fn, coordinator, window);
}

relay_hub_actor start_relay_hub(caf::actor_system& sys, const coordinator_actor& coordinator,
                                step_batcher_actor batcher, std::shared_ptr<LaunchTokens> tokens,
                                std::string* address) {
  auto hub = sys.spawn(hub_fn, coordinator, std::move(batcher), std::move(tokens));
  HandshakeLimits limits;
  limits.per_address = 256;  // every connection of the hub comes from loopback: its host's workers
  auto port = publish(hub, 0, "127.0.0.1", limits);
  if (!port) {
    *address = sys.render(port.error());
    caf::anon_send_exit(hub, caf::exit_reason::user_shutdown);
    return {};
  }
  *address = "127.0.0.1:" + std::to_string(*port);
  return hub;
}

caf::expected<coordinator_actor> connect_relay(caf::actor_system& sys, const std::string& address,
                                               const std::string& token) {
  const auto [host, port] = parse_host_port(address);
  auto hub = connect_with_retry<relay_hub_actor>(sys, host, port, std::chrono::milliseconds(250),
                                                 std::chrono::seconds(4));
  if (!hub) return hub.error();
  caf::scoped_actor self{sys};
  caf::expected<coordinator_actor> out{caf::sec::request_timeout};
  self->request(*hub, std::chrono::seconds(30), relay_atom::value, token)
      .receive([&](coordinator_actor& relay) { out = std::move(relay); },
               [&](caf::error& e) { out = std::move(e); });
  return out;
}

}  // namespace troupe::worker
