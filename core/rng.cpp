#include "core/rng.hpp"

#include <cmath>

#include "core/error.hpp"

namespace troupe::rng {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr double kTwoPi = 6.283185307179586476925286766559;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

inline std::array<uint32_t, 4> block_at(uint64_t seed, uint64_t key, uint64_t index) {
  // counter = (index, key), Philox key = seed: distinct names never share a counter.
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// 53 high bits of (hi, lo) mapped to [0, 1).
inline double to_unit(uint32_t hi, uint32_t lo) {
  uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

inline double box_muller(const std::array<uint32_t, 4>& r) {
  // u1 in (0, 1] so that log(u1) is finite.
  double u1 = 1.0 - to_unit(r[0], r[1]);
  double u2 = to_unit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kWeyl0;
      k[1] += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

double uniform(uint64_t seed, uint64_t key, uint64_t index) {
  auto r = block_at(seed, key, index);
  return to_unit(r[0], r[1]);
}

double normal(uint64_t seed, uint64_t key, uint64_t index) { return box_muller(block_at(seed, key, index)); }

void fill_normal(float* out, size_t n, uint64_t seed, uint64_t key, uint64_t first_index, double mean,
                 double std) {
  TROUPE_CHECK(out != nullptr || n == 0, "null output");
  for (size_t j = 0; j < n; ++j) out[j] = static_cast<float>(mean + std * normal(seed, key, first_index + j));
}

void fill_uniform(float* out, size_t n, uint64_t seed, uint64_t key, uint64_t first_index, double lo,
                  double hi) {
  TROUPE_CHECK(out != nullptr || n == 0, "null output");
  for (size_t j = 0; j < n; ++j)
    out[j] = static_cast<float>(lo + (hi - lo) * uniform(seed, key, first_index + j));
}

uint32_t Stream::next_u32() {
  uint64_t b = pos_ / 4;
  if (b != cached_block_) {
    block_ = block_at(seed_, key_, b);
    cached_block_ = b;
  }
  return block_[pos_++ % 4];
}

uint64_t Stream::next_u64() {
  uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double Stream::uniform() {
  uint32_t hi = next_u32();
  uint32_t lo = next_u32();
  return to_unit(hi, lo);
}

double Stream::normal() {
  std::array<uint32_t, 4> r{next_u32(), next_u32(), next_u32(), next_u32()};
  return box_muller(r);
}

uint64_t Stream::below(uint64_t n) {
  TROUPE_CHECK(n > 0, "below(0)");
  // Rejection keeps the result unbiased: accept only draws under the largest multiple of n.
  uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  for (;;) {
    uint64_t x = next_u64();
    if (x < limit) return x % n;
  }
}

}  // namespace troupe::rng
