// Each simulated node its own CAF node id. CAF 0.17.6 builds a node id from the host's id
// and caf::detail::get_process_id(), which libcaf_core calls through its PLT: the definition
// below, in the executable, takes its place. A real process id is below 2^22; these have the
// top bit set, the simulated process's index and a counter, so they never equal each other
// or a real process's.
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "bench/scale/sim.hpp"

namespace {
std::atomic<int> process_index{-1};
std::atomic<uint32_t> next_id{0};
}  // namespace

namespace caf::detail {
unsigned get_process_id() {
  const int p = process_index.load();
  if (p < 0) return static_cast<unsigned>(::getpid());
  return 0x80000000u | (static_cast<uint32_t>(p & 0x7ff) << 20) | (next_id.fetch_add(1) & 0xfffffu);
}
}  // namespace caf::detail

namespace troupe::scale {
void distinct_node_ids(int index) { process_index.store(index); }
}  // namespace troupe::scale
