// Correctness checks of every Communicator operation against a simple oracle,
// shared by the in-process (local, gloo threads) tests and the multi-process
// helper comm_test_rank. A mismatch throws std::runtime_error naming the op,
// size and element.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/groups.hpp"
#include "core/dtype_convert.hpp"

namespace troupe::comm::testing {

// The message is built only on failure: the checks run over 1Mi elements.
#define COMM_EXPECT(cond, what)                               \
  do {                                                        \
    if (!(cond)) throw std::runtime_error(std::string(what)); \
  } while (0)

// Small integers: every sum over <= 8 ranks is exact in fp32, so the oracle
// is bitwise.
inline float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}

inline void check_allreduce(Communicator& c, size_t count, ReduceOp op) {
  const int n = c.size();
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = value(c.rank(), i);
  c.allreduce(x.data(), count, op);
  const float s = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    float want = s * static_cast<float>(i % 13 + 1);
    if (op == ReduceOp::avg) want /= static_cast<float>(n);
    COMM_EXPECT(x[i] == want, "allreduce " + std::string(to_string(op)) + " count " + std::to_string(count) +
                                  " element " + std::to_string(i) + ": got " + std::to_string(x[i]) +
                                  " want " + std::to_string(want));
  }
}

inline void check_reduce_scatter(Communicator& c, size_t count, ReduceOp op) {
  const int n = c.size();
  std::vector<float> in(count * n), out(count, -1.f);
  for (size_t j = 0; j < in.size(); ++j) in[j] = value(c.rank(), j);
  c.reduce_scatter(in.data(), out.data(), count, op);
  const float s = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    const size_t j = c.rank() * count + i;
    float want = s * static_cast<float>(j % 13 + 1);
    if (op == ReduceOp::avg) want /= static_cast<float>(n);
    COMM_EXPECT(out[i] == want, "reduce_scatter " + std::string(to_string(op)) + " count " +
                                    std::to_string(count) + " element " + std::to_string(i) + ": got " +
                                    std::to_string(out[i]) + " want " + std::to_string(want));
  }
}

inline void check_allgather(Communicator& c, size_t count, bool in_place) {
  const int n = c.size();
  std::vector<int32_t> in(count), out(count * n, -1);
  for (size_t i = 0; i < count; ++i) in[i] = c.rank() * 100000 + static_cast<int32_t>(i % 99991);
  if (in_place) {
    std::copy(in.begin(), in.end(), out.begin() + c.rank() * count);
    c.allgather(out.data() + c.rank() * count, out.data(), count);
  } else {
    c.allgather(in.data(), out.data(), count);
  }
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      COMM_EXPECT(out[r * count + i] == r * 100000 + static_cast<int32_t>(i % 99991),
                  "allgather count " + std::to_string(count) + " from rank " + std::to_string(r) +
                      " element " + std::to_string(i));
}

inline void check_broadcast(Communicator& c, size_t count, int root) {
  std::vector<double> x(count, 0.0);
  if (c.rank() == root)
    for (size_t i = 0; i < count; ++i) x[i] = 0.5 + static_cast<double>(i);
  c.broadcast(x.data(), count, root);
  for (size_t i = 0; i < count; ++i)
    COMM_EXPECT(x[i] == 0.5 + static_cast<double>(i), "broadcast count " + std::to_string(count) + " root " +
                                                          std::to_string(root) + " element " +
                                                          std::to_string(i));
}

inline void check_other_types(Communicator& c) {
  const int n = c.size();
  std::vector<int64_t> a(7);
  std::vector<double> b(7);
  std::vector<int32_t> m(7);
  for (int i = 0; i < 7; ++i) {
    a[i] = (int64_t{1} << 40) * (c.rank() + 1) + i;
    b[i] = 0.25 * (c.rank() + 1);
    m[i] = (c.rank() * 7 + i) % 5 - c.rank();
  }
  c.allreduce(a.data(), 7, ReduceOp::sum);
  c.allreduce(b.data(), 7, ReduceOp::avg);
  std::vector<int32_t> mx = m, mn = m;
  c.allreduce(mx.data(), 7, ReduceOp::max);
  c.allreduce(mn.data(), 7, ReduceOp::min);
  for (int i = 0; i < 7; ++i) {
    COMM_EXPECT(a[i] == (int64_t{1} << 40) * (n * (n + 1) / 2) + int64_t{n} * i, "allreduce i64 sum");
    COMM_EXPECT(b[i] == 0.25 * (n * (n + 1) / 2) / n, "allreduce f64 avg");
    int32_t want_max = INT32_MIN, want_min = INT32_MAX;
    for (int r = 0; r < n; ++r) {
      const int32_t v = (r * 7 + i) % 5 - r;
      want_max = std::max(want_max, v);
      want_min = std::min(want_min, v);
    }
    COMM_EXPECT(mx[i] == want_max, "allreduce i32 max");
    COMM_EXPECT(mn[i] == want_min, "allreduce i32 min");
  }
}

// bf16 and f16 (uint16_t bit patterns): the reductions on small integers and
// halves, exact in both formats whatever the order or rounding, so the oracle is
// bitwise on every backend; gathers and broadcasts move the bits untouched
// (NaN payloads and negative zero included).
inline void check_half_types(Communicator& c) {
  const int n = c.size();
  const float s = static_cast<float>(n * (n + 1) / 2);
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::string name = dtype_name(dt);
    auto narrow = [dt](float f) { return dt == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f); };
    auto widen = [dt](uint16_t h) { return dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h); };
    for (size_t count : {size_t{1}, size_t{7}, size_t{3000}}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        std::vector<uint16_t> x(count);
        for (size_t i = 0; i < count; ++i) x[i] = narrow(value(c.rank(), i));
        c.allreduce(x.data(), count, dt, op);
        for (size_t i = 0; i < count; ++i) {
          const float k = static_cast<float>(i % 13 + 1);
          float want = s * k;
          if (op == ReduceOp::avg) want /= static_cast<float>(n);
          if (op == ReduceOp::max) want = static_cast<float>(n) * k;
          if (op == ReduceOp::min) want = k;
          COMM_EXPECT(x[i] == narrow(want), "allreduce " + name + " " + to_string(op) + " count " +
                                                std::to_string(count) + " element " + std::to_string(i) +
                                                ": got " + std::to_string(widen(x[i])) + " want " +
                                                std::to_string(want));
        }
      }
      std::vector<uint16_t> in(count * n), out(count);
      for (size_t j = 0; j < in.size(); ++j) in[j] = narrow(value(c.rank(), j));
      c.reduce_scatter(in.data(), out.data(), count, dt, ReduceOp::sum);
      for (size_t i = 0; i < count; ++i) {
        const float want = s * static_cast<float>((c.rank() * count + i) % 13 + 1);
        COMM_EXPECT(out[i] == narrow(want), "reduce_scatter " + name + " element " + std::to_string(i));
      }
    }
    // Bit patterns no arithmetic may touch: a quiet NaN with a payload, -0, the largest finite.
    const std::vector<uint16_t> odd = {0x7fc1, 0x8000,
                                       dt == DType::bf16 ? uint16_t{0x7f7f} : uint16_t{0x7bff}};
    std::vector<uint16_t> mine(3), all(3 * n);
    for (size_t i = 0; i < 3; ++i)
      mine[i] = static_cast<uint16_t>(odd[i] ^ (c.rank() == 0 ? 0 : 0x0001u * i));
    c.allgather(mine.data(), all.data(), 3, dt);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < 3; ++i)
        COMM_EXPECT(all[r * 3 + i] == static_cast<uint16_t>(odd[i] ^ (r == 0 ? 0 : 0x0001u * i)),
                    "allgather " + name + " from rank " + std::to_string(r));
    std::vector<uint16_t> b = c.rank() == 0 ? odd : std::vector<uint16_t>(3, 0);
    c.broadcast(b.data(), 3, dt, 0);
    COMM_EXPECT(b == odd, "broadcast " + name);
  }
}

// Rank 0 sends tags 1, 2, 1 to rank 1 in one batch; rank 1 receives tag 2
// first: tags match, and the two tag-1 messages keep their order.
inline void check_tags(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  const std::vector<int32_t> a{1, 2, 3}, b{4, 5, 6, 7}, d{8, 9, 10};
  if (c.rank() == 0) {
    c.batch(
        {P2POp::send(a.data(), 12, 1, 1), P2POp::send(b.data(), 16, 1, 2), P2POp::send(d.data(), 12, 1, 1)});
  } else {
    std::vector<int32_t> x(4), y(3), z(3);
    c.recv(x.data(), 16, 0, 2);
    c.recv(y.data(), 12, 0, 1);
    c.recv(z.data(), 12, 0, 1);
    COMM_EXPECT(x == b, "recv tag 2 got the wrong message");
    COMM_EXPECT(y == a, "first recv tag 1 got the wrong message");
    COMM_EXPECT(z == d, "second recv tag 1 got the wrong message");
  }
}

// Every rank sends to rank+1 and receives from rank-1 in one batch: the
// pipeline neighbour exchange that blocking sends would deadlock on.
inline void check_ring_exchange(Communicator& c, size_t count) {
  const int n = c.size();
  if (n < 2) return;
  const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
  std::vector<float> out(count), in(count, -1.f);
  for (size_t i = 0; i < count; ++i) out[i] = value(c.rank(), i);
  c.batch({P2POp::recv(in.data(), count * 4, prev, 7), P2POp::send(out.data(), count * 4, next, 7)});
  for (size_t i = 0; i < count; ++i)
    COMM_EXPECT(in[i] == value(prev, i),
                "ring exchange count " + std::to_string(count) + " element " + std::to_string(i));
}

inline void check_all_ops(Communicator& c) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1} << 20}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      check_allreduce(c, count, op);
      check_reduce_scatter(c, count, op);
    }
    check_allgather(c, count, false);
    check_allgather(c, count, true);
    check_broadcast(c, count, c.size() - 1);
    check_broadcast(c, count, 0);
    check_ring_exchange(c, count);
  }
  check_other_types(c);
  check_half_types(c);
  check_tags(c);
  c.barrier();
}

// World + its data, pipeline and tensor groups of a dp x pp x tp grid: each
// group reduces, gathers and broadcasts its members' world ranks.
inline void check_grid(Communicator& world, int dp, int pp, int tp) {
  const int r = world.rank();
  const GridGroups g = grid_groups(dp, pp, tp);
  struct Kind {
    const char* name;
    const std::vector<std::vector<int>>* groups;
  };
  for (const Kind& k : {Kind{"dp", &g.data}, Kind{"pp", &g.pipeline}, Kind{"tp", &g.tensor}}) {
    const auto& members = group_of(*k.groups, r);
    auto sub = world.new_group(members, group_name(k.name, *k.groups, r));
    COMM_EXPECT(sub->size() == static_cast<int>(members.size()), std::string(k.name) + " group size");
    int32_t sum = r;
    sub->allreduce(&sum, 1, ReduceOp::sum);
    int32_t want = 0;
    for (int m : members) want += m;
    COMM_EXPECT(sum == want, std::string(k.name) + " group allreduce");
    std::vector<int32_t> all(members.size(), -1);
    int32_t me = r;
    sub->allgather(&me, all.data(), 1);
    COMM_EXPECT(all == std::vector<int32_t>(members.begin(), members.end()),
                std::string(k.name) + " group allgather");
    int32_t root = r;
    sub->broadcast(&root, 1, 0);
    COMM_EXPECT(root == members[0], std::string(k.name) + " group broadcast");
  }
  world.barrier();
}

}  // namespace troupe::comm::testing
