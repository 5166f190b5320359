// The control port's acceptor: CAF's OpenSSL one (libcaf_openssl's middleman_actor.cpp, 0.17.6)
// with a handshake guard (actors/handshake_guard.hpp) in front of it.
//
// CAF's version accepts, starts an SSL session on the socket and hands the connection to the
// BASP broker, which waits for its peer for ever. This one does the same through the same
// public pieces (caf::openssl::make_session, io::network::stream_impl) and also:
//
//   * counts each accepted connection as pending in a PendingHandshakes table, under its
//     peer's address, until the peer's first application bytes arrive (its BASP handshake,
//     which only comes once TLS is done and the peer holds the cluster secret);
//   * closes the oldest pending connection of an address that has per_address of them, and
//     the oldest of all past `total`, as a new one is accepted;
//   * moves each accepted descriptor to a number not used lately (DescriptorCursor: CAF names
//     a connection by its number, and forgets a closed one a turn later);
//   * closes every connection still pending at the deadline: a reaper thread looks every
//     deadline / 20 and shuts the socket down (shutdown(2), not close(2): the multiplexer
//     sees the end of the stream and frees the connection and its descriptor the usual way).
//
// The table and the descriptors it names are guarded by one mutex; a connection leaves the
// table (under it) before its socket is closed, so the reaper never shuts down a descriptor
// number that was reused.
#include <sys/socket.h>
#include <unistd.h>

#include <caf/io/basp_broker.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/io/network/rw_state.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/openssl/session.hpp>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "actors/system.hpp"

namespace troupe::actors {

namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::rw_state;

// The table, the descriptors of its entries, and the thread that enforces the deadline.
class Gate : public std::enable_shared_from_this<Gate> {
 public:
  explicit Gate(HandshakeLimits limits) : table_(limits) {}
  ~Gate() {
    {
      std::lock_guard<std::mutex> lock(control_->mu);
      control_->stop = true;
    }
    control_->cv.notify_all();
    if (!reaper_.joinable()) return;
    if (reaper_.get_id() == std::this_thread::get_id())
      reaper_.detach();  // the last reference went in the reaper's own tick; it ends at once
    else
      reaper_.join();
  }

  void start() {
    const auto period = std::max(std::chrono::milliseconds(10), table_.limits().deadline / 20);
    reaper_ = std::thread([weak = weak_from_this(), control = control_, period] {
      std::unique_lock<std::mutex> lock(control->mu);
      while (!control->stop) {
        control->cv.wait_for(lock, period);
        if (control->stop) break;
        lock.unlock();
        if (auto gate = weak.lock()) gate->reap();
        lock.lock();
      }
    });
  }

  // A connection accepted on `fd` from `address`: its id; the connections it displaces are shut.
  PendingHandshakes::Id admit(const std::string& address, native_socket fd) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PendingHandshakes::Id> evict;
    const auto id = table_.admit(address, PendingHandshakes::Clock::now(), &evict);
    fds_[id] = fd;
    shut(evict);
    return id;
  }
  void established(PendingHandshakes::Id id) {
    std::lock_guard<std::mutex> lock(mu_);
    table_.established(id);
    fds_.erase(id);
  }
  void closed(PendingHandshakes::Id id) { established(id); }

 private:
  struct Control {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
  };

  void reap() {
    std::lock_guard<std::mutex> lock(mu_);
    shut(table_.expired(PendingHandshakes::Clock::now()));
  }
  void shut(const std::vector<PendingHandshakes::Id>& ids) {
    for (auto id : ids) {
      auto it = fds_.find(id);
      if (it == fds_.end()) continue;
      ::shutdown(it->second, SHUT_RDWR);
      fds_.erase(it);
    }
  }

  std::mutex mu_;
  PendingHandshakes table_;
  std::map<PendingHandshakes::Id, native_socket> fds_;
  std::shared_ptr<Control> control_ = std::make_shared<Control>();
  std::thread reaper_;
};

// CAF's SSL policy, and the first application bytes as the end of the handshake.
class GuardedPolicy {
 public:
  GuardedPolicy(caf::openssl::session_ptr session, std::shared_ptr<Gate> gate, PendingHandshakes::Id id)
      : session_(std::move(session)), gate_(std::move(gate)), id_(id) {}
  ~GuardedPolicy() { gate_->closed(id_); }
  GuardedPolicy(const GuardedPolicy&) = delete;
  GuardedPolicy& operator=(const GuardedPolicy&) = delete;

  rw_state read_some(size_t& result, native_socket fd, void* buf, size_t len) {
    const rw_state s = session_->read_some(result, fd, buf, len);
    if (!established_ && s == rw_state::success && result > 0) {
      established_ = true;
      gate_->established(id_);
    }
    return s;
  }
  rw_state write_some(size_t& result, native_socket fd, const void* buf, size_t len) {
    return session_->write_some(result, fd, buf, len);
  }
  bool must_read_more(native_socket fd, size_t threshold) { return session_->must_read_more(fd, threshold); }

 private:
  caf::openssl::session_ptr session_;
  std::shared_ptr<Gate> gate_;
  PendingHandshakes::Id id_;
  bool established_ = false;
};

// An accepted descriptor at a number no connection of this process had lately
// (actors/handshake_guard.hpp, DescriptorCursor): one cursor for all the process's acceptors,
// as all of a node's connections are named in one BASP broker's tables. TROUPE_FRESH_DESCRIPTORS=0
// leaves descriptors where accept(2) put them (for measurements of the difference).
native_socket fresh_descriptor(native_socket fd) {
  static const bool on = [] {
    const char* v = std::getenv("TROUPE_FRESH_DESCRIPTORS");
    return v == nullptr || std::string(v) != "0";
  }();
  if (!on) return fd;
  static std::mutex mu;
  static DescriptorCursor cursor;
  std::lock_guard<std::mutex> lock(mu);
  return cursor.place(fd);
}

// An accepted connection, as CAF's OpenSSL scribe is.
class GuardedScribe : public caf::io::scribe {
 public:
  GuardedScribe(default_multiplexer& mpx, native_socket fd, caf::openssl::session_ptr session,
                std::shared_ptr<Gate> gate, PendingHandshakes::Id id)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)),
        stream_(mpx, fd, std::move(session), std::move(gate), id) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
    // The first write drives SSL_accept on, as CAF's scribe does.
    stream_.force_empty_write(this);
  }

  bool launched_ = false;
  caf::io::network::stream_impl<GuardedPolicy> stream_;
};

class GuardedDoorman : public caf::io::network::doorman_impl {
 public:
  GuardedDoorman(default_multiplexer& mpx, native_socket fd, std::shared_ptr<Gate> gate)
      : caf::io::network::doorman_impl(mpx, fd), gate_(std::move(gate)) {}

  bool new_connection() override {
    native_socket fd = acceptor_.accepted_socket();
    if (detached()) {
      ::close(fd);
      return false;
    }
    auto& mpx = acceptor_.backend();
    fd = fresh_descriptor(fd);
    caf::io::network::nonblocking(fd, true);
    caf::io::network::child_process_inherit(fd, false);
    auto session = caf::openssl::make_session(parent()->system(), fd, true);
    if (session == nullptr) {
      ::close(fd);
      return false;
    }
    auto peer = caf::io::network::remote_addr_of_fd(fd);
    const auto id = gate_->admit(peer ? *peer : std::string("?"), fd);
    auto scribe = caf::make_counted<GuardedScribe>(mpx, fd, std::move(session), gate_, id);
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return caf::io::doorman::new_connection(&mpx, hdl);
  }

 private:
  std::shared_ptr<Gate> gate_;
};

}  // namespace

caf::expected<uint16_t> publish_guarded(caf::actor_system& sys, caf::strong_actor_ptr whom,
                                        std::set<std::string> sigs, uint16_t port, const std::string& host,
                                        const HandshakeLimits& limits) {
  if (whom == nullptr) return caf::sec::cannot_publish_invalid_actor;
  auto fd = caf::io::network::new_tcp_acceptor_impl(port, host.empty() ? nullptr : host.c_str(), true);
  if (!fd) return std::move(fd.error());
  auto gate = std::make_shared<Gate>(limits);
  gate->start();
  auto& mpx = static_cast<default_multiplexer&>(sys.middleman().backend());
  auto door = caf::make_counted<GuardedDoorman>(mpx, *fd, std::move(gate));
  const uint16_t actual = door->port();
  // As CAF's middleman actor publishes: the BASP broker takes the acceptor and the actor.
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::anon_send(broker, caf::publish_atom::value, caf::io::doorman_ptr{std::move(door)}, actual,
                 std::move(whom), std::move(sigs));
  return actual;
}

}  // namespace troupe::actors
