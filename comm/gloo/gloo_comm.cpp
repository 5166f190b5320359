#include "comm/gloo/gloo_comm.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "comm/gloo/shm_group.hpp"
#include "comm/reduce.hpp"

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::UnboundBuffer;

// Slot prefixes of our own unbound-buffer traffic; gloo's collectives use 0x01..0x08.
constexpr uint8_t kP2PSlotPrefix = 0x20;
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
constexpr uint8_t kAbortSlotPrefix = 0x22;

// gloo reports its own timeouts as IoException("Timed out ..."); a peer that
// closed or died is any other IoException.
CommErrc classify(const std::string& what) {
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos ||
      what.find("Timeout") != std::string::npos || what.find("timeout") != std::string::npos)
    return CommErrc::timed_out;
  return CommErrc::peer_lost;
}

class AbortableContext;

// gloo's TCP buffer, whose waits its context can fail: gloo's own collectives make their
// buffers (their scratch and the caller's data) through the context, out of reach otherwise.
class LiveBuffer final : public UnboundBuffer {
 public:
  LiveBuffer(std::unique_ptr<UnboundBuffer> inner, std::shared_ptr<AbortableContext> owner);
  ~LiveBuffer() override;

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return check(inner_->waitRecv(rank, timeout));
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return check(inner_->waitSend(rank, timeout));
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->send(dst, slot, offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(src, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(std::move(srcs), slot, offset, nbytes);
  }

  // Any thread: the wait in progress and every later one throw.
  void fail() {
    failed_ = true;
    inner_->abortWaitRecv();
    inner_->abortWaitSend();
  }

 private:
  bool check(bool ok) const {
    if (!ok && failed_) throw gloo::IoException("communicator aborted");
    return ok;
  }
  std::shared_ptr<AbortableContext> owner_;  // outlives inner_
  std::unique_ptr<UnboundBuffer> inner_;
  std::atomic<bool> failed_{false};
};

// gloo's TCP context, with an abort() that ends every operation in flight. gloo fails the waits
// of a pair that closes on an error only while their receive is still pending: a receive whose
// payload has begun to arrive (the peer's host cut off mid-message) is listed nowhere, and its
// wait would last the whole operation timeout.
class AbortableContext final : public gloo::transport::Context,
                               public std::enable_shared_from_this<AbortableContext> {
 public:
  explicit AbortableContext(std::shared_ptr<gloo::transport::Context> inner)
      : gloo::transport::Context(inner->rank, inner->size), inner_(std::move(inner)) {}

  std::unique_ptr<gloo::transport::Pair>& getPair(int r) override { return inner_->getPair(r); }
  std::unique_ptr<gloo::transport::Pair>& createPair(int r) override { return inner_->createPair(r); }
  std::unique_ptr<UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<LiveBuffer>(inner_->createUnboundBuffer(ptr, size), shared_from_this());
  }
  gloo::transport::Context& inner() { return *inner_; }

  // Every buffer of the context that exists: its wait in progress, or its next, throws.
  void fail_all() {
    std::lock_guard<std::mutex> lock(live_m_);
    for (LiveBuffer* b : live_) b->fail();
  }

 private:
  friend class LiveBuffer;
  std::shared_ptr<gloo::transport::Context> inner_;
  std::mutex live_m_;
  std::set<LiveBuffer*> live_;
};

LiveBuffer::LiveBuffer(std::unique_ptr<UnboundBuffer> inner, std::shared_ptr<AbortableContext> owner)
    : UnboundBuffer(inner->ptr, inner->size), owner_(std::move(owner)), inner_(std::move(inner)) {
  std::lock_guard<std::mutex> lock(owner_->live_m_);
  owner_->live_.insert(this);
}

LiveBuffer::~LiveBuffer() {
  std::lock_guard<std::mutex> lock(owner_->live_m_);
  owner_->live_.erase(this);
}

// The context and what abort() needs to reach the operation in flight.
struct GlooState {
  std::shared_ptr<gloo::Context> ctx;
  std::shared_ptr<AbortableContext> transport;  // ctx's
  std::atomic<bool> aborted{false};

  void wait(UnboundBuffer* b, Clock::time_point deadline, bool recv) {
    if (aborted) throw CommError(CommErrc::aborted, "aborted");
    const auto left =
        std::max(std::chrono::milliseconds(1),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (!(recv ? b->waitRecv(nullptr, left) : b->waitSend(nullptr, left)))
      throw CommError(CommErrc::aborted, "wait interrupted by abort");
  }

  // Every wait of the context, gloo's collectives' included, throws, and every connection
  // closes, so that the peers fail too. `peer`: a connected rank (-1: none).
  void abort(int peer) {
    aborted = true;
    if (peer >= 0) {
      // A receive that times out makes gloo fail every pair of the context ("Application
      // timeout caused pair closure"): the waits it lists throw and every connection closes.
      // A 1 ms receive on a slot nobody sends to triggers exactly that.
      char byte = 0;
      auto probe = ctx->createUnboundBuffer(&byte, 1);
      try {
        probe->recv(peer, gloo::Slot::build(kAbortSlotPrefix, 0), 0, 1);
        probe->waitRecv(nullptr, std::chrono::milliseconds(1));
      } catch (const std::exception&) {
        // Expected: the timeout (or an already closed pair) is the point.
      }
    }
    // Pairs the probe did not reach (its own closed before) close too: once closed, none is
    // read into or written from again; then every buffer's wait fails, those gloo lists
    // nowhere included.
    ctx->closeConnections();
    transport->fail_all();
  }
};

// A gloo context connected to the given peers only. gloo's own connectFullMesh connects every
// pair and has each rank read the host name of every lower rank and one blob of every peer's
// addresses: O(N^2) store requests and bytes for a group of N. Here each rank publishes one
// address per peer ("pair/<from>/<to>") and connects it to the one its peer published for it:
// 2 requests per peer. A pair's two ends must name each other. The order does not matter: of
// each pair, the end with the lower address waits for the other to connect, so no cycle of
// waits can form.
class PeerContext : public gloo::Context {
 public:
  using gloo::Context::Context;
  // Returns the transport context it made (also this context's).
  std::shared_ptr<AbortableContext> connect(Store& store,
                                            const std::shared_ptr<gloo::transport::Device>& device,
                                            const std::vector<int>& peers,
                                            std::chrono::milliseconds timeout) {
    auto tc = std::make_shared<AbortableContext>(device->createContext(rank, size));
    tc->inner().setTimeout(getTimeout());
    tc->setTimeout(getTimeout());
    const auto key = [](int from, int to) {
      return "pair/" + std::to_string(from) + "/" + std::to_string(to);
    };
    for (int p : peers) {
      const auto bytes = tc->createPair(p)->address().bytes();
      store.set(key(rank, p), std::string(bytes.begin(), bytes.end()));
    }
    for (int p : peers) {
      const std::string a = store.get(key(p, rank), timeout);
      tc->getPair(p)->connect(std::vector<char>(a.begin(), a.end()));
    }
    device_ = device;
    transportContext_ = tc;
    return tc;
  }
};

struct GlooShared {
  std::shared_ptr<Store> store;  // unprefixed job store
  std::shared_ptr<gloo::transport::Device> device;
  bool shm = true;
};

// The element type gloo sizes the buffer by; bf16 / f16 travel as their bit
// patterns, and reduce_into does their arithmetic in f32.
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::bf16:
    case DType::f16:
      return f(uint16_t{});
    case DType::u8:
      return f(uint8_t{});
  }
}

class GlooCommunicator : public Communicator {
 public:
  // `peers`: the ranks to connect to (point-to-point with them only, no collective); none =
  // every other rank.
  GlooCommunicator(std::shared_ptr<GlooShared> shared, int rank, int size, const std::string& prefix,
                   std::chrono::milliseconds timeout,
                   const std::optional<std::vector<int>>& peers = std::nullopt)
      : Communicator(rank, size, prefix), shared_(std::move(shared)), st_(std::make_shared<GlooState>()) {
    for (int p = 0; p < size; ++p)
      if (p != rank && (!peers || std::count(peers->begin(), peers->end(), p))) peers_.push_back(p);
    full_ = static_cast<int>(peers_.size()) == size - 1;
    auto ctx = std::make_shared<PeerContext>(rank, size);
    ctx->setTimeout(timeout);
    auto prefixed = std::make_shared<PrefixStore>(prefix, shared_->store);
    try {
      st_->transport = ctx->connect(*prefixed, shared_->device, peers_, timeout);
      if (shared_->shm && full_) shm_ = ShmGroup::create(*prefixed, rank, size, timeout);
    } catch (const CommError& e) {
      throw CommError(e.code(), describe("connect", -1, e.what()));
    } catch (const gloo::IoException& e) {
      throw CommError(classify(e.what()), describe("connect", -1, e.what()));
    } catch (const std::exception& e) {
      throw CommError(CommErrc::internal, describe("connect", -1, e.what()));
    }
    st_->ctx = std::move(ctx);
  }

  const char* backend() const override { return "gloo"; }

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt) override {
    need_all("allreduce");
    if (shm_)
      return run("allreduce", opt,
                 [&] { shm_->allreduce(data, count, dtype, op, Clock::now() + opt.timeout); });
    const int n = size();
    run("allreduce", opt, [st = st_, data, count, dtype, op, n, timeout = opt.timeout] {
      with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions o(st->ctx);
        o.setOutput(static_cast<T*>(data), count);
        // gloo's ring combines chunks pairwise into the buffer's type: a bf16 / f16
        // partial sum is added in f32 and rounded at every hop (the shm path
        // accumulates all ranks in f32 and rounds once).
        o.setReduceFunction([dtype, op](void* out, const void* a, const void* b, size_t k) {
          reduce_into(dtype, op, out, a, b, k);
        });
        o.setTimeout(timeout);
        gloo::allreduce(o);
      });
      if (op == ReduceOp::avg) divide_by(dtype, data, count, n);
    });
  }

  // Ring: at step s (0..n-2) rank r sends the partial sum of chunk
  // (r-s-1) mod n to r+1 and receives chunk (r-s-2) mod n from r-1, adding its
  // own contribution; after n-1 steps it holds chunk r reduced over all ranks.
  // Each link carries (n-1)/n of the input, like the reduce-scatter half of a
  // ring allreduce.
  void do_reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                         const Options& opt) override {
    need_all("reduce_scatter");
    if (shm_)
      return run("reduce_scatter", opt,
                 [&] { shm_->reduce_scatter(in, out, count, dtype, op, Clock::now() + opt.timeout); });
    const int n = size(), r = rank();
    run("reduce_scatter", opt, [st = st_, in, out, count, dtype, op, n, r, timeout = opt.timeout] {
      const size_t bytes = count * dtype_size(dtype);
      const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, 0);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const char* input = static_cast<const char*>(in);
      std::vector<char> a(bytes), b(bytes);
      auto in_buf = st->ctx->createUnboundBuffer(const_cast<char*>(input), bytes * n);
      auto send_buf = st->ctx->createUnboundBuffer(a.data(), bytes);
      auto recv_buf = st->ctx->createUnboundBuffer(b.data(), bytes);
      const auto deadline = Clock::now() + timeout;
      for (int s = 0; s < n - 1; ++s) {
        const int c_send = ((r - s - 1) % n + n) % n;
        const int c_recv = ((r - s - 2) % n + n) % n;
        recv_buf->recv(prev, slot, 0, bytes);
        auto* sender = s == 0 ? in_buf.get() : send_buf.get();
        sender->send(next, slot, s == 0 ? c_send * bytes : 0, bytes);
        st->wait(recv_buf.get(), deadline, true);
        st->wait(sender, deadline, false);
        reduce_into(dtype, op, recv_buf->ptr, recv_buf->ptr, input + c_recv * bytes, count);
        std::swap(send_buf, recv_buf);
      }
      std::memcpy(out, send_buf->ptr, bytes);
      if (op == ReduceOp::avg) divide_by(dtype, out, count, n);
    });
  }

  void do_allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt) override {
    need_all("allgather");
    if (shm_)
      return run("allgather", opt,
                 [&] { shm_->allgather(in, out, count, dtype, Clock::now() + opt.timeout); });
    const int n = size(), r = rank();
    run("allgather", opt, [st = st_, in, out, count, dtype, n, r, timeout = opt.timeout] {
      const size_t bytes = count * dtype_size(dtype);
      gloo::AllgatherOptions o(st->ctx);
      char* outp = static_cast<char*>(out);
      // Unset input = the contribution is already in place in the output.
      if (in != outp + r * bytes) o.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      o.setOutput(outp, bytes * n);
      o.setTimeout(timeout);
      gloo::allgather(o);
    });
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root, const Options& opt) override {
    need_all("broadcast");
    if (shm_)
      return run("broadcast", opt,
                 [&] { shm_->broadcast(data, count, dtype, root, Clock::now() + opt.timeout); });
    run("broadcast", opt, [st = st_, data, count, dtype, root, timeout = opt.timeout] {
      gloo::BroadcastOptions o(st->ctx);
      o.setOutput(static_cast<char*>(data), count * dtype_size(dtype));
      o.setRoot(root);
      o.setTimeout(timeout);
      gloo::broadcast(o);
    });
  }

  void do_barrier(const Options& opt) override {
    need_all("barrier");
    if (shm_) return run("barrier", opt, [&] { shm_->barrier(Clock::now() + opt.timeout); });
    run("barrier", opt, [st = st_, timeout = opt.timeout] {
      gloo::BarrierOptions o(st->ctx);
      o.setTimeout(timeout);
      gloo::barrier(o);
    });
  }

  void do_batch(const std::vector<P2POp>& ops, const Options& opt) override {
    for (const auto& o : ops)
      if (!full_ && !std::binary_search(peers_.begin(), peers_.end(), o.peer))
        fail(CommErrc::invalid_argument, o.kind == P2POp::Kind::recv ? "recv" : "send", o.peer,
             "not a peer this communicator connected");
    run("sendrecv", opt, [st = st_, ops, timeout = opt.timeout] {
      const auto deadline = Clock::now() + timeout;
      std::vector<std::unique_ptr<UnboundBuffer>> bufs;
      for (const auto& o : ops) {
        bufs.push_back(st->ctx->createUnboundBuffer(o.data, o.bytes));
        const auto slot = gloo::Slot::build(kP2PSlotPrefix, o.tag);
        if (o.kind == P2POp::Kind::recv)
          bufs.back()->recv(o.peer, slot, 0, o.bytes);
        else
          bufs.back()->send(o.peer, slot, 0, o.bytes);
      }
      for (size_t i = 0; i < ops.size(); ++i)
        st->wait(bufs[i].get(), deadline, ops[i].kind == P2POp::Kind::recv);
    });
  }

  void do_abort() override {
    if (shm_) shm_->abort();
    if (!st_->ctx) return;
    // The probe that poisons the context goes to a connected peer: the next rank when all are.
    const int next = (rank() + 1) % size();
    st_->abort(peers_.empty() ? -1 : full_ ? next : peers_.front());
  }

  std::unique_ptr<Communicator> do_new_group(const std::vector<int>& ranks, int new_rank,
                                             const std::string& name) override {
    return std::make_unique<GlooCommunicator>(shared_, new_rank, static_cast<int>(ranks.size()),
                                              group() + name + "/", st_->ctx->getTimeout());
  }

  // A collective needs every pair; point-to-point only the peers connected.
  void need_all(const char* op) {
    if (!full_)
      fail(CommErrc::invalid_argument, op, -1,
           "this communicator connects " + std::to_string(peers_.size()) + " of its " +
               std::to_string(size() - 1) + " peers: point-to-point with them only");
  }

 private:
  // Runs fn on the calling thread; gloo enforces the op's timeout, abort()
  // interrupts it (see AbortableContext). Maps every failure to a CommError.
  template <class F>
  void run(const char* op, const Options& /*opt*/, F&& fn) {
    CommErrc code = CommErrc::internal;
    std::string what;
    try {
      fn();
      return;
    } catch (const CommError& e) {
      code = e.code();
      what = e.what();
    } catch (const gloo::IoException& e) {
      code = classify(e.what());
      what = e.what();
    } catch (const gloo::EnforceNotMet& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
    if (abort_requested()) code = CommErrc::aborted;
    // Peers blocked on us learn at once instead of at their own timeout.
    if (shm_) shm_->break_group(code);
    st_->ctx->closeConnections();
    fail(code, op, -1, what);
  }

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<GlooState> st_;
  std::unique_ptr<ShmGroup> shm_;  // same-host collectives, when every rank is here
  std::vector<int> peers_;         // the ranks connected to, ascending
  bool full_ = true;               // every other rank is
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const CommConfig& cfg) {
  // gloo writes to its sockets with writev, which raises SIGPIPE when a peer
  // died: the default action would kill this rank instead of letting it report
  // peer_lost. Ignored unless the process installed its own handler.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (!cfg.store) throw CommError(CommErrc::invalid_argument, "make_communicator(gloo): config has no store");
  auto shared = std::make_shared<GlooShared>();
  shared->store = cfg.store;
  const char* env = std::getenv("TROUPE_COMM_SHM");
  shared->shm = cfg.shm && !(env && std::string(env) == "0");
  gloo::transport::tcp::attr attr;
  attr.hostname = cfg.hostname;
  try {
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(CommErrc::invalid_argument, "make_communicator(gloo): cannot open a TCP device on '" +
                                                    cfg.hostname + "': " + e.what());
  }
  return std::make_unique<GlooCommunicator>(
      shared, cfg.rank, cfg.size, store_prefix(cfg.job, cfg.generation, cfg.group), cfg.timeout, cfg.peers);
}

}  // namespace troupe::comm
