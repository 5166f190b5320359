// The data plane: collectives and point-to-point transfers between the ranks of
// a group. Tensors between workers travel here, never through actors.
//
//   backend  ranks are         transport             made by
//   local    threads           shared memory         make_local_world + make_communicator
//   gloo     processes (CPU)   TCP (gloo options API) make_communicator + a Store
//   nccl     processes (GPU)   NVLink / IB / PCIe     make_communicator + a Store (CUDA builds)
// The gloo backend runs the collectives of a group whose ranks share one host
// through shared memory (CommConfig::shm); point-to-point stays on TCP.
//
// Contract, the same for every backend:
// * Every operation is collective over the group in the same order on every
//   rank (point-to-point: over the two ranks). Buffers are in place where the
//   signature has one pointer. Zero-length buffers are valid everywhere.
// * Every operation has a deadline (Options::timeout) and fails with a
//   CommError whose code names the cause (peer_lost, timed_out, aborted,
//   invalid_argument, internal) and whose message names the op, the rank, the
//   peer when known and the group. Nothing blocks past its deadline.
// * After a failure the communicator is poisoned: poisoned() is true and every
//   later call throws the first error again. Build a new one (new generation).
// * abort() may be called from any thread; it makes the operation in flight on
//   this rank fail with CommError{aborted} promptly, and tells the peers (they
//   fail with peer_lost).
// * One thread uses a communicator at a time (abort() excepted).
//
// Element types are troupe::DType (core/dtype.hpp). Every dtype moves through
// allgather, broadcast and send/recv (bytes). Reductions (allreduce,
// reduce_scatter) take f32, f64, i32, i64, bf16 and f16; u8 is refused with
// CommError{invalid_argument} naming the dtype and the backend. The 16-bit
// floats are reduced in f32 arithmetic:
//   local, gloo same-host (shm)  every rank's values summed in f32, rounded once
//                                (an average divides the f32 sum, then rounds)
//   gloo TCP                     gloo's reduction function adds in f32 and rounds
//                                each partial sum to the buffer's type, per hop
//   nccl                         ncclBfloat16 / ncclFloat16, NCCL's own reduction
// so a 16-bit sum over n ranks may differ in its last bits between backends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/error.hpp"
#include "comm/store.hpp"
#include "core/dtype.hpp"

namespace troupe::comm {

enum class ReduceOp { sum, avg, max, min };

// This process's host as shared memory sees it: the host name, and the mount and process
// namespaces. Two processes with the same identity share /dev/shm and /proc.
std::string host_identity();

const char* to_string(ReduceOp op);

struct Options {
  std::chrono::milliseconds timeout{30000};
};

// One half of a point-to-point transfer. A send matches the receive posted by
// `peer` with the same tag; several messages with one tag between the same
// two ranks arrive in the order they were sent.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind;
  void* data;  // const for sends
  size_t bytes;
  int peer;
  uint32_t tag;
  static P2POp send(const void* d, size_t n, int peer, uint32_t tag) {
    return {Kind::send, const_cast<void*>(d), n, peer, tag};
  }
  static P2POp recv(void* d, size_t n, int peer, uint32_t tag) { return {Kind::recv, d, n, peer, tag}; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's store namespace, e.g. "job/g3/dp1/".
  const std::string& group() const { return group_; }
  virtual const char* backend() const = 0;

  // Buffers are `count` elements of `dtype` (bf16 / f16: uint16_t bit patterns).
  // data (count) <- reduce over ranks of data (count).
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt = {});
  // out (count) <- reduce over ranks of in[rank*count .. (rank+1)*count); in is (size*count).
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                      const Options& opt = {});
  // out (size*count) <- concat over ranks of in (count). in may be out + rank*count.
  void allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt = {});
  // data (count) on every rank <- data of root.
  void broadcast(void* data, size_t count, DType dtype, int root, const Options& opt = {});
  void barrier(const Options& opt = {});
  // Posts every op, then waits for all: a batch may send to and receive from
  // the same peer without deadlock (pipeline neighbours exchanging).
  void batch(const std::vector<P2POp>& ops, const Options& opt = {});
  void send(const void* data, size_t bytes, int peer, uint32_t tag, const Options& opt = {});
  void recv(void* data, size_t bytes, int peer, uint32_t tag, const Options& opt = {});

  template <class T>
  void allreduce(T* data, size_t count, ReduceOp op, const Options& opt = {}) {
    allreduce(static_cast<void*>(data), count, dtype_of<T>(), op, opt);
  }
  template <class T>
  void reduce_scatter(const T* in, T* out, size_t count, ReduceOp op, const Options& opt = {}) {
    reduce_scatter(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>(), op, opt);
  }
  template <class T>
  void allgather(const T* in, T* out, size_t count, const Options& opt = {}) {
    allgather(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>(), opt);
  }
  template <class T>
  void broadcast(T* data, size_t count, int root, const Options& opt = {}) {
    broadcast(static_cast<void*>(data), count, dtype_of<T>(), root, opt);
  }

  // Thread-safe. See the contract above.
  void abort();
  bool poisoned() const { return poisoned_.load(); }

  // A communicator over a subset of this group's ranks (given as ranks of this
  // group, in the order that defines the new ranks). Collective over the
  // members only; each member passes the same list and name. The name must be
  // unique within this group for the life of the job generation.
  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks, const std::string& name);

 protected:
  Communicator(int rank, int size, std::string group);

  virtual void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt) = 0;
  virtual void do_reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                 const Options& opt) = 0;
  virtual void do_allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt) = 0;
  virtual void do_broadcast(void* data, size_t count, DType dtype, int root, const Options& opt) = 0;
  virtual void do_barrier(const Options& opt) = 0;
  virtual void do_batch(const std::vector<P2POp>& ops, const Options& opt) = 0;
  virtual void do_abort() = 0;
  virtual std::unique_ptr<Communicator> do_new_group(const std::vector<int>& ranks, int new_rank,
                                                     const std::string& name) = 0;

  // "op on group 'g' (backend) rank r/n[, peer p]: detail"
  std::string describe(const char* op, int peer, const std::string& detail) const;
  // Poisons the communicator with this error and throws it.
  [[noreturn]] void fail(CommErrc code, const char* op, int peer, const std::string& detail);
  bool abort_requested() const { return abort_requested_.load(); }
  // Whether allreduce / reduce_scatter take this dtype: f32, f64, i32, i64, bf16,
  // f16. A backend without a reduction for one of them overrides this, and the
  // call is refused with CommError{invalid_argument} naming the dtype and backend.
  virtual bool can_reduce(DType dtype) const;

 private:
  void check_usable(const char* op);
  // `reduces`: the op combines values (allreduce, reduce_scatter), not only moves them.
  void check_dtype_op(const char* op, DType dtype, ReduceOp rop, bool reduces);
  template <class F>
  void guarded(const char* op, F&& f);

  int rank_;
  int size_;
  std::string group_;
  std::atomic<bool> poisoned_{false};
  std::atomic<bool> abort_requested_{false};
  mutable std::mutex first_error_m_;
  CommErrc first_code_ = CommErrc::internal;
  std::string first_message_;
};

class LocalWorld;
// The shared state of `size` ranks that are threads of this process.
std::shared_ptr<LocalWorld> make_local_world(int size);

struct CommConfig {
  std::string backend = "gloo";  // local | gloo | nccl
  int rank = 0;
  int size = 1;
  std::string job = "job";
  int64_t generation = 0;
  std::string group = "world";
  // Deadline for building the communicator (rendezvous + connections).
  std::chrono::milliseconds timeout{30000};
  std::shared_ptr<Store> store;        // gloo, nccl: the unprefixed job store
  std::string hostname = "127.0.0.1";  // gloo: the interface this rank listens on
  // gloo: collectives of a group whose ranks share this host go through shared
  // memory (comm/gloo/shm_group.hpp); TROUPE_COMM_SHM=0 in the environment
  // turns it off too. Point-to-point always uses TCP.
  bool shm = true;
  // gloo: connect to these ranks only (each must name this rank too): point-to-point with them
  // and no collective. Unset = every rank. A communicator that only spawns groups or talks to
  // its neighbours so costs no full mesh of `size` ranks.
  std::optional<std::vector<int>> peers;
  int device = 0;                           // nccl: CUDA device ordinal
  std::shared_ptr<LocalWorld> local_world;  // local
};

// Throws CommError{invalid_argument} for an unknown or unbuilt backend, and the
// rendezvous's CommError (timed_out, peer_lost) when the group cannot form.
std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg);

// Whether this build has the backend ("nccl" needs a CUDA build).
bool backend_available(const std::string& backend);

}  // namespace troupe::comm
