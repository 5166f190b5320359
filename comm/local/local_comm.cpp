#include "comm/local/local_comm.hpp"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "comm/reduce.hpp"

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Shared by the ranks of one group.
//
// A collective is two barriers around a read of the pointer table:
//   1. each rank publishes its buffers, barrier A;
//   2. each rank computes its own result into private memory from the
//      published inputs, barrier B (nobody reads any more);
//   3. each rank writes its result into its own output.
// Step 3 after B is what makes in-place operations safe.
struct LocalGroup {
  explicit LocalGroup(int n) : size(n), in(n), out(n) {}
  const int size;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  // Once broken (timeout or abort of any member), every wait in the group fails.
  bool broken = false;
  CommErrc broken_code = CommErrc::internal;
  int broken_by = -1;
  std::vector<const void*> in;
  std::vector<void*> out;
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::string>> mail;  // (src, dst, tag)
};

}  // namespace

class LocalWorld {
 public:
  explicit LocalWorld(int n) : size(n) {}
  const int size;
  std::shared_ptr<LocalGroup> group(const std::string& key, int n) {
    std::lock_guard<std::mutex> lock(m_);
    auto& g = groups_[key];
    if (!g) g = std::make_shared<LocalGroup>(n);
    return g;
  }

 private:
  std::mutex m_;
  std::map<std::string, std::shared_ptr<LocalGroup>> groups_;
};

std::shared_ptr<LocalWorld> make_local_world(int size) {
  if (size < 1) throw CommError(CommErrc::invalid_argument, "make_local_world: size must be >= 1");
  return std::make_shared<LocalWorld>(size);
}

namespace {

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorld> world, std::shared_ptr<LocalGroup> g, int rank, int size,
                    std::string group)
      : Communicator(rank, size, std::move(group)), world_(std::move(world)), g_(std::move(g)) {}

  const char* backend() const override { return "local"; }

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op, const Options& opt) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<char> acc(bytes);
    collective("allreduce", opt, data, data,
               [&](const std::vector<const void*>& in) { reduce_all(dtype, op, acc.data(), in, count); });
    std::memcpy(data, acc.data(), bytes);
  }

  void do_reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                         const Options& opt) override {
    const size_t bytes = count * dtype_size(dtype);
    const size_t offset = static_cast<size_t>(rank()) * bytes;
    std::vector<char> acc(bytes);
    collective("reduce_scatter", opt, in, out, [&](const std::vector<const void*>& ins) {
      std::vector<const void*> parts;
      for (const void* p : ins) parts.push_back(static_cast<const char*>(p) + offset);
      reduce_all(dtype, op, acc.data(), parts, count);
    });
    std::memcpy(out, acc.data(), bytes);
  }

  void do_allgather(const void* in, void* out, size_t count, DType dtype, const Options& opt) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<char> acc(bytes * size());
    collective("allgather", opt, in, out, [&](const std::vector<const void*>& ins) {
      for (int r = 0; r < size(); ++r) std::memcpy(acc.data() + r * bytes, ins[r], bytes);
    });
    std::memcpy(out, acc.data(), acc.size());
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root, const Options& opt) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<char> acc(bytes);
    collective("broadcast", opt, data, data,
               [&](const std::vector<const void*>& ins) { std::memcpy(acc.data(), ins[root], bytes); });
    if (rank() != root) std::memcpy(data, acc.data(), bytes);
  }

  void do_barrier(const Options& opt) override {
    collective("barrier", opt, nullptr, nullptr, [](const std::vector<const void*>&) {});
  }

  // Sends are eager (copied into the mailbox), so posting every send before
  // any receive cannot deadlock.
  void do_batch(const std::vector<P2POp>& ops, const Options& opt) override {
    const auto deadline = Clock::now() + opt.timeout;
    std::unique_lock<std::mutex> lock(g_->m);
    for (const auto& o : ops) {
      if (o.kind != P2POp::Kind::send) continue;
      throw_if_broken("send", o.peer);
      g_->mail[{rank(), o.peer, o.tag}].emplace_back(static_cast<const char*>(o.data), o.bytes);
    }
    g_->cv.notify_all();
    for (const auto& o : ops) {
      if (o.kind != P2POp::Kind::recv) continue;
      auto& q = g_->mail[{o.peer, rank(), o.tag}];
      wait(lock, deadline, "recv", o.peer, [&] { return !q.empty(); });
      if (q.front().size() != o.bytes)
        fail(CommErrc::invalid_argument, "recv", o.peer,
             "message of " + std::to_string(q.front().size()) + " bytes with tag " + std::to_string(o.tag) +
                 " does not fit the posted " + std::to_string(o.bytes) + " bytes");
      std::memcpy(o.data, q.front().data(), o.bytes);
      q.pop_front();
    }
  }

  void do_abort() override { break_group(CommErrc::aborted); }

  std::unique_ptr<Communicator> do_new_group(const std::vector<int>& ranks, int new_rank,
                                             const std::string& name) override {
    const std::string key = group() + name + "/";
    const int n = static_cast<int>(ranks.size());
    return std::make_unique<LocalCommunicator>(world_, world_->group(key, n), new_rank, n, key);
  }

 private:
  template <class Compute>
  void collective(const char* op, const Options& opt, const void* in, void* out, Compute&& compute) {
    const auto deadline = Clock::now() + opt.timeout;
    std::vector<const void*> ins;
    {
      std::unique_lock<std::mutex> lock(g_->m);
      g_->in[rank()] = in;
      g_->out[rank()] = out;
      arrive(lock, deadline, op);
      ins = g_->in;
    }
    compute(ins);
    std::unique_lock<std::mutex> lock(g_->m);
    arrive(lock, deadline, op);
  }

  void arrive(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, const char* op) {
    throw_if_broken(op, -1);
    const uint64_t gen = g_->generation;
    if (++g_->arrived == g_->size) {
      g_->arrived = 0;
      ++g_->generation;
      g_->cv.notify_all();
      return;
    }
    wait(lock, deadline, op, -1, [&] { return g_->generation != gen; });
  }

  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, const char* op, int peer,
            Pred&& ready) {
    for (;;) {
      throw_if_broken(op, peer);
      if (ready()) return;
      if (g_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready() && !g_->broken) {
        mark_broken(CommErrc::timed_out);
        fail(CommErrc::timed_out, op, peer, "deadline passed");
      }
    }
  }

  void throw_if_broken(const char* op, int peer) {
    if (!g_->broken) return;
    if (g_->broken_by == rank()) fail(g_->broken_code, op, peer, "this rank failed the group");
    fail(CommErrc::peer_lost, op, g_->broken_by,
         std::string("rank ") + std::to_string(g_->broken_by) + " left the group (" +
             to_string(g_->broken_code) + ")");
  }

  void mark_broken(CommErrc code) {
    if (g_->broken) return;
    g_->broken = true;
    g_->broken_code = code;
    g_->broken_by = rank();
    g_->cv.notify_all();
  }

  void break_group(CommErrc code) {
    std::lock_guard<std::mutex> lock(g_->m);
    mark_broken(code);
  }

  std::shared_ptr<LocalWorld> world_;
  std::shared_ptr<LocalGroup> g_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(const CommConfig& cfg) {
  if (!cfg.local_world)
    throw CommError(CommErrc::invalid_argument, "make_communicator(local): config has no local_world");
  if (cfg.local_world->size != cfg.size)
    throw CommError(CommErrc::invalid_argument, "make_communicator(local): world size " +
                                                    std::to_string(cfg.local_world->size) +
                                                    " != config size " + std::to_string(cfg.size));
  const std::string key = store_prefix(cfg.job, cfg.generation, cfg.group);
  return std::make_unique<LocalCommunicator>(cfg.local_world, cfg.local_world->group(key, cfg.size), cfg.rank,
                                             cfg.size, key);
}

}  // namespace troupe::comm
