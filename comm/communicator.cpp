#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "comm/gloo/gloo_comm.hpp"
#include "comm/local/local_comm.hpp"
#include "kernels/cuda_backend.hpp"

namespace troupe::comm {

std::string host_identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string id = host;
  // Same host name in another container is not the same /dev/shm.
  for (const char* ns : {"/proc/self/ns/mnt", "/proc/self/ns/pid"}) {
    char buf[128] = {0};
    const ssize_t n = ::readlink(ns, buf, sizeof(buf) - 1);
    id += "|" + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }
  return id;
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

Communicator::Communicator(int rank, int size, std::string group)
    : rank_(rank), size_(size), group_(std::move(group)) {}

std::string Communicator::describe(const char* op, int peer, const std::string& detail) const {
  std::string s = std::string(op) + " on group '" + group_ + "' (" + backend() + ") rank " +
                  std::to_string(rank_) + "/" + std::to_string(size_);
  if (peer >= 0) s += ", peer " + std::to_string(peer);
  return s + ": " + detail;
}

void Communicator::fail(CommErrc code, const char* op, int peer, const std::string& detail) {
  CommError e(code, describe(op, peer, detail));
  {
    std::lock_guard<std::mutex> lock(first_error_m_);
    if (!poisoned_.load()) {
      first_code_ = code;
      first_message_ = e.what();
      poisoned_.store(true);
    }
  }
  throw e;
}

void Communicator::check_usable(const char* op) {
  if (!poisoned_.load()) return;
  std::lock_guard<std::mutex> lock(first_error_m_);
  throw CommError(first_code_, describe(op, -1,
                                        "communicator is poisoned by an earlier failure [" + first_message_ +
                                            "]; build a new one"));
}

void Communicator::check_dtype_op(const char* op, DType dtype, ReduceOp rop, bool reduces) {
  if (!is_valid(dtype)) fail(CommErrc::invalid_argument, op, -1, "unknown dtype");
  if (rop != ReduceOp::sum && rop != ReduceOp::avg && rop != ReduceOp::max && rop != ReduceOp::min)
    fail(CommErrc::invalid_argument, op, -1, "unknown reduce op");
  if (reduces && !can_reduce(dtype))
    fail(CommErrc::invalid_argument, op, -1,
         std::string(dtype_name(dtype)) + " buffers cannot be reduced by the " + backend() + " backend (" +
             dtype_name(dtype) + " moves with allgather, broadcast and send/recv)");
}

bool Communicator::can_reduce(DType dtype) const {
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::i32:
    case DType::i64:
    case DType::bf16:
    case DType::f16:
      return true;
    default:
      return false;
  }
}

// Runs a backend operation: refuses on a poisoned communicator, poisons it on
// any failure, and turns stray exceptions into CommError{internal}.
template <class F>
void Communicator::guarded(const char* op, F&& f) {
  check_usable(op);
  try {
    f();
  } catch (const CommError& e) {
    {
      std::lock_guard<std::mutex> lock(first_error_m_);
      if (!poisoned_.load()) {
        first_code_ = e.code();
        first_message_ = e.what();
        poisoned_.store(true);
      }
    }
    throw;
  } catch (const std::exception& e) {
    fail(CommErrc::internal, op, -1, e.what());
  }
}

void Communicator::allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt) {
  guarded("allreduce", [&] {
    check_dtype_op("allreduce", dtype, op, true);
    if (count == 0 || size_ == 1) return;
    if (!data) fail(CommErrc::invalid_argument, "allreduce", -1, "null buffer");
    do_allreduce(data, count, dtype, op, opt);
  });
}

void Communicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                  const Options& opt) {
  guarded("reduce_scatter", [&] {
    check_dtype_op("reduce_scatter", dtype, op, true);
    if (count == 0) return;
    if (!in || !out) fail(CommErrc::invalid_argument, "reduce_scatter", -1, "null buffer");
    if (size_ == 1) {
      std::memmove(out, in, count * dtype_size(dtype));
      return;
    }
    do_reduce_scatter(in, out, count, dtype, op, opt);
  });
}

void Communicator::allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt) {
  guarded("allgather", [&] {
    check_dtype_op("allgather", dtype, ReduceOp::sum, false);
    if (count == 0) return;
    if (!in || !out) fail(CommErrc::invalid_argument, "allgather", -1, "null buffer");
    if (size_ == 1) {
      std::memmove(out, in, count * dtype_size(dtype));
      return;
    }
    do_allgather(in, out, count, dtype, opt);
  });
}

void Communicator::broadcast(void* data, size_t count, DType dtype, int root, const Options& opt) {
  guarded("broadcast", [&] {
    check_dtype_op("broadcast", dtype, ReduceOp::sum, false);
    if (root < 0 || root >= size_)
      fail(CommErrc::invalid_argument, "broadcast", -1,
           "root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")");
    if (count == 0 || size_ == 1) return;
    if (!data) fail(CommErrc::invalid_argument, "broadcast", -1, "null buffer");
    do_broadcast(data, count, dtype, root, opt);
  });
}

void Communicator::barrier(const Options& opt) {
  guarded("barrier", [&] {
    if (size_ == 1) return;
    do_barrier(opt);
  });
}

void Communicator::batch(const std::vector<P2POp>& ops, const Options& opt) {
  guarded("sendrecv", [&] {
    std::vector<P2POp> nonempty;
    for (const auto& o : ops) {
      if (o.peer < 0 || o.peer >= size_ || o.peer == rank_)
        fail(CommErrc::invalid_argument, o.kind == P2POp::Kind::send ? "send" : "recv", o.peer,
             "peer must be another rank of the group (size " + std::to_string(size_) + ")");
      if (o.bytes == 0) continue;
      if (!o.data) fail(CommErrc::invalid_argument, "sendrecv", o.peer, "null buffer");
      nonempty.push_back(o);
    }
    if (nonempty.empty()) return;
    do_batch(nonempty, opt);
  });
}

void Communicator::send(const void* data, size_t bytes, int peer, uint32_t tag, const Options& opt) {
  batch({P2POp::send(data, bytes, peer, tag)}, opt);
}

void Communicator::recv(void* data, size_t bytes, int peer, uint32_t tag, const Options& opt) {
  batch({P2POp::recv(data, bytes, peer, tag)}, opt);
}

void Communicator::abort() {
  abort_requested_.store(true);
  {
    std::lock_guard<std::mutex> lock(first_error_m_);
    if (!poisoned_.load()) {
      first_code_ = CommErrc::aborted;
      first_message_ = describe("abort", -1, "communicator aborted");
      poisoned_.store(true);
    }
  }
  do_abort();
}

std::unique_ptr<Communicator> Communicator::new_group(const std::vector<int>& ranks,
                                                      const std::string& name) {
  check_usable("new_group");
  if (ranks.empty()) fail(CommErrc::invalid_argument, "new_group", -1, "empty rank list");
  std::set<int> seen;
  int new_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= size_ || !seen.insert(r).second)
      fail(CommErrc::invalid_argument, "new_group", r, "rank out of range or repeated in the group list");
    if (r == rank_) new_rank = static_cast<int>(i);
  }
  if (new_rank < 0)
    fail(CommErrc::invalid_argument, "new_group", -1, "this rank is not a member of '" + name + "'");
  if (name.empty() || name.find('/') != std::string::npos)
    fail(CommErrc::invalid_argument, "new_group", -1, "group name must be non-empty and free of '/'");
  return do_new_group(ranks, new_rank, name);
}

bool backend_available(const std::string& backend) {
  if (backend == "local" || backend == "gloo") return true;
  return backend == "nccl" && kernels::cuda_built();
}

std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg) {
  if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
    throw CommError(CommErrc::invalid_argument, "make_communicator: rank " + std::to_string(cfg.rank) +
                                                    " outside a group of size " + std::to_string(cfg.size));
  if (cfg.backend == "local") return make_local_communicator(cfg);
  if (cfg.backend == "gloo") return make_gloo_communicator(cfg);
  if (cfg.backend == "nccl" && kernels::cuda_built()) {
    std::string why;
    const kernels::CudaBackend* cuda = kernels::cuda_backend(&why);
    if (cuda == nullptr) throw CommError(CommErrc::invalid_argument, "make_communicator: nccl: " + why);
    return cuda->make_nccl_communicator(cfg);
  }
  throw CommError(CommErrc::invalid_argument, "make_communicator: backend '" + cfg.backend +
                                                  "' is unknown or not built in (local, gloo" +
                                                  std::string(kernels::cuda_built() ? ", nccl" : "") + ")");
}

}  // namespace troupe::comm
