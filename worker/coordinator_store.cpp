#include "worker/coordinator_store.hpp"

#include "comm/error.hpp"

namespace troupe::worker {

namespace {

using namespace troupe::actors;

class CoordinatorStore : public comm::Store {
 public:
  CoordinatorStore(caf::actor_system& sys, coordinator_actor c, std::string job, int gen,
                   std::chrono::milliseconds timeout)
      : sys_(sys), coord_(std::move(c)), job_(std::move(job)), gen_(gen), timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) override {
    check(ask(
              key,
              [&](caf::scoped_actor& self, const StoreKey& k) {
                return self->request(coord_, timeout_, store_set_atom::value, k, value);
              },
              timeout_),
          "set", key);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    // The coordinator parks the get until the key is set or `timeout` passes; the
    // request itself waits a little longer so that the coordinator's answer wins.
    auto v = ask(
        key,
        [&](caf::scoped_actor& self, const StoreKey& k) {
          return self->request(coord_, timeout + timeout_, store_get_atom::value, k,
                               int64_t(timeout.count()));
        },
        timeout + timeout_);
    check(v, "get", key);
    return v.value;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      get(k, std::max(left, std::chrono::milliseconds(0)));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    auto v = ask(
        key,
        [&](caf::scoped_actor& self, const StoreKey& k) {
          return self->request(coord_, timeout_, store_add_atom::value, k, delta);
        },
        timeout_);
    check(v, "add", key);
    return std::stoll(v.value);
  }

 private:
  template <class Send>
  StoreValue ask(const std::string& key, Send send, std::chrono::milliseconds) {
    caf::scoped_actor self{sys_};
    StoreValue out;
    StoreKey k{job_, gen_, "", key};
    send(self, k).receive([&](StoreValue& v) { out = std::move(v); },
                          [&](caf::error& e) {
                            out.found = false;
                            out.error = e == caf::sec::request_timeout
                                            ? "timed out waiting for key '" + key + "'"
                                            : sys_.render(e);
                          });
    return out;
  }
  void check(const StoreValue& v, const char* op, const std::string& key) const {
    if (v.found) return;
    bool timeout = v.error.rfind("timed out", 0) == 0;
    throw comm::CommError(timeout ? comm::CommErrc::timed_out : comm::CommErrc::internal,
                          std::string("coordinator store ") + op + " '" + key + "' (job " + job_ +
                              ", generation " + std::to_string(gen_) + "): " + v.error);
  }

  caf::actor_system& sys_;
  coordinator_actor coord_;
  std::string job_;
  int gen_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::shared_ptr<comm::Store> make_coordinator_store(caf::actor_system& sys,
                                                    actors::coordinator_actor coordinator, std::string job_id,
                                                    int generation,
                                                    std::chrono::milliseconds request_timeout) {
  return std::make_shared<CoordinatorStore>(sys, std::move(coordinator), std::move(job_id), generation,
                                            request_timeout);
}

}  // namespace troupe::worker
