#include "comm/nccl/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;

// ncclBfloat16 came with NCCL 2.10; an older NCCL refuses bf16 reductions
// (NcclCommunicator::can_reduce) and moves bf16 as bytes.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
constexpr bool kNcclBf16 = true;
#else
constexpr bool kNcclBf16 = false;
#endif

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclBfloat16;
#else
      return ncclFloat16;  // never reduced (can_reduce); allgather and broadcast copy 2-byte elements
#endif
    case DType::u8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

CommErrc classify(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return CommErrc::peer_lost;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return CommErrc::invalid_argument;
    default:
      return CommErrc::internal;
  }
}

struct NcclShared {
  std::shared_ptr<Store> store;
  int device = 0;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclShared> shared, int rank, int size, const std::string& prefix,
                   std::chrono::milliseconds timeout)
      : Communicator(rank, size, prefix), shared_(std::move(shared)), timeout_(timeout) {
    cuda_check("connect", cudaSetDevice(shared_->device));
    PrefixStore store(prefix, shared_->store);
    ncclUniqueId id;
    if (rank == 0) {
      nccl_check_sync("connect", ncclGetUniqueId(&id));
      store.set("nccl_unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string v = store.get("nccl_unique_id", timeout);
      if (v.size() != sizeof(id))
        fail(CommErrc::internal, "connect", 0, "malformed NCCL unique id in the store");
      std::memcpy(&id, v.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) fail(classify(r), "connect", -1, ncclGetErrorString(r));
    wait_comm_ready("connect", Clock::now() + timeout);
    cuda_check("connect", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda_check("connect", cudaMalloc(&scratch_, sizeof(float)));
  }

  ~NcclCommunicator() override {
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) {
      // A poisoned communicator may have work stuck on a dead peer: abort
      // instead of the flush that ncclCommDestroy would wait for.
      if (poisoned())
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
  }

  const char* backend() const override { return "nccl"; }

 protected:
  bool can_reduce(DType dtype) const override {
    return (dtype != DType::bf16 || kNcclBf16) && Communicator::can_reduce(dtype);
  }

  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt) override {
    enqueue("allreduce", ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    wait_stream("allreduce", opt);
  }

  void do_reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                         const Options& opt) override {
    enqueue("reduce_scatter",
            ncclReduceScatter(in, out, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    wait_stream("reduce_scatter", opt);
  }

  void do_allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt) override {
    enqueue("allgather", ncclAllGather(in, out, count, nccl_type(dtype), comm_, stream_));
    wait_stream("allgather", opt);
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root, const Options& opt) override {
    enqueue("broadcast", ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_));
    wait_stream("broadcast", opt);
  }

  void do_barrier(const Options& opt) override {
    enqueue("barrier", ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    wait_stream("barrier", opt);
  }

  void do_batch(const std::vector<P2POp>& ops, const Options& opt) override {
    enqueue("sendrecv", ncclGroupStart());
    for (const auto& o : ops) {
      if (o.kind == P2POp::Kind::send)
        enqueue("send", ncclSend(o.data, o.bytes, ncclUint8, o.peer, comm_, stream_));
      else
        enqueue("recv", ncclRecv(o.data, o.bytes, ncclUint8, o.peer, comm_, stream_));
    }
    enqueue("sendrecv", ncclGroupEnd());
    wait_stream("sendrecv", opt);
  }

  // The waiting thread polls the flag and calls ncclCommAbort itself, so the
  // communicator is never torn down under a call of another thread.
  void do_abort() override {}

  std::unique_ptr<Communicator> do_new_group(const std::vector<int>& ranks, int new_rank,
                                             const std::string& name) override {
    return std::make_unique<NcclCommunicator>(shared_, new_rank, static_cast<int>(ranks.size()),
                                              group() + name + "/", timeout_);
  }

 private:
  void cuda_check(const char* op, cudaError_t e) {
    if (e != cudaSuccess) fail(CommErrc::internal, op, -1, std::string("CUDA: ") + cudaGetErrorString(e));
  }
  void nccl_check_sync(const char* op, ncclResult_t r) {
    if (r != ncclSuccess) fail(classify(r), op, -1, ncclGetErrorString(r));
  }
  // In non-blocking mode a call may answer ncclInProgress; completion is then
  // observed through ncclCommGetAsyncError.
  void enqueue(const char* op, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) fail(classify(r), op, -1, detail(r));
  }

  std::string detail(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) s += std::string(" (") + last + ")";
    }
    return s;
  }

  void abort_comm() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void wait_comm_ready(const char* op, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        const std::string d = detail(st);
        abort_comm();
        fail(classify(st), op, -1, d);
      }
      poll_interrupts(op, deadline);
    }
  }

  void poll_interrupts(const char* op, Clock::time_point deadline) {
    if (abort_requested()) {
      abort_comm();
      fail(CommErrc::aborted, op, -1, "aborted while in flight");
    }
    if (Clock::now() >= deadline) {
      abort_comm();
      fail(CommErrc::timed_out, op, -1, "deadline passed");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  void wait_stream(const char* op, const Options& opt) {
    const auto deadline = Clock::now() + opt.timeout;
    wait_comm_ready(op, deadline);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort_comm();
        fail(CommErrc::internal, op, -1, std::string("CUDA: ") + cudaGetErrorString(q));
      }
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        const std::string d = detail(st);
        abort_comm();
        fail(classify(st), op, -1, d);
      }
      poll_interrupts(op, deadline);
    }
  }

  std::shared_ptr<NcclShared> shared_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

int nccl_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Communicator> make_nccl_communicator(const CommConfig& cfg) {
  if (!cfg.store) throw CommError(CommErrc::invalid_argument, "make_communicator(nccl): config has no store");
  if (nccl_device_count() <= cfg.device)
    throw CommError(CommErrc::invalid_argument, "make_communicator(nccl): CUDA device " +
                                                    std::to_string(cfg.device) + " is not available");
  auto shared = std::make_shared<NcclShared>();
  shared->store = cfg.store;
  shared->device = cfg.device;
  return std::make_unique<NcclCommunicator>(shared, cfg.rank, cfg.size,
                                            store_prefix(cfg.job, cfg.generation, cfg.group), cfg.timeout);
}

}  // namespace troupe::comm
