// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// Every value is a pure function of (seed, key, index): element i of the
// parameter named `name` is drawn from (seed, name_hash(name), i). Any slice of
// a parameter can therefore be initialised on its own and equals the same slice
// of the full tensor, which is what lets every parallel layout hold slices of
// one and the same model.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe::rng {

// One Philox4x32-10 block: 4 x 32 random bits from a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Stable 64-bit FNV-1a hash of a name (the same on every machine and build).
uint64_t name_hash(std::string_view name);

// Element `index` of the stream (seed, key): uniform in [0, 1) with 53 random bits,
// and standard normal (Box-Muller on two 53-bit uniforms; one Philox block per element).
double uniform(uint64_t seed, uint64_t key, uint64_t index);
double normal(uint64_t seed, uint64_t key, uint64_t index);

// out[j] = mean + std * normal(seed, key, first_index + j) for j in [0, n), rounded to float.
void fill_normal(float* out, size_t n, uint64_t seed, uint64_t key, uint64_t first_index, double mean,
                 double std);
// out[j] = lo + (hi - lo) * uniform(seed, key, first_index + j).
void fill_uniform(float* out, size_t n, uint64_t seed, uint64_t key, uint64_t first_index, double lo,
                  double hi);

// Sequential draws for code that consumes random numbers one after another
// (sampling, synthetic data). Position is explicit so the stream can be saved
// and resumed: Stream(seed, key, position()) continues where this one stands.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t key, uint64_t position = 0) : seed_(seed), key_(key), pos_(position) {}
  uint32_t next_u32();
  uint64_t next_u64();
  double uniform();                           // [0, 1), 53 bits
  double normal();                            // standard normal
  uint64_t below(uint64_t n);                 // uniform integer in [0, n), unbiased
  uint64_t position() const { return pos_; }  // 32-bit words consumed so far

 private:
  uint64_t seed_, key_, pos_;
  uint64_t cached_block_ = ~uint64_t{0};
  std::array<uint32_t, 4> block_{};
};

}  // namespace troupe::rng
