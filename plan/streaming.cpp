// A device with a small fast memory and a slower tier behind a link (an IPU's In-Processor
// Memory and its Streaming Memory): what overflows the fast memory is placed in the slow one,
// the parts that move least per byte first, and every byte placed there crosses the link each
// time it is used. Priced per pipeline rank (plan/cost_internal.hpp: stream_overflow).
#include <algorithm>
#include <array>

#include "plan/cost_internal.hpp"

namespace troupe::plan::detail {

StreamPlan stream_overflow(const RankBytes& r, double on_chip, double capacity) {
  StreamPlan s;
  double over = r.total - on_chip;
  if (over <= 0) return s;
  const double m = std::max(1, r.n_micro);
  // Bytes moved per step for each byte of a part that lives in the slow tier:
  //   optimizer   read and written once, by the update;
  //   parameters  read by every forward and backward (and the recomputed forward) of every
  //               micro-batch, written once by the update;
  //   gradients   read and written by every micro-batch's backward (they accumulate);
  //   activations written by a micro-batch's forward and read by its backward: a rank moves one
  //               micro-batch's worth (act_one) per micro-batch, of the peak it holds.
  struct Part {
    double bytes, per_byte;
    int kind;  // 0 optimizer, 1 parameters, 2 gradients, 3 activations
  };
  const auto beyond = [](double part, double working) { return std::max(0.0, part - working); };
  std::array<Part, 4> parts{{{r.optimizer, 2.0, 0},
                             {beyond(r.params, r.working_params), r.passes * m + 1, 1},
                             {beyond(r.grads, r.working_grads), 2 * m, 2},
                             {beyond(r.activations, r.working_activations),
                              r.activations > 0 ? 2 * m * r.act_one / r.activations : 0, 3}}};
  std::stable_sort(parts.begin(), parts.end(),
                   [](const Part& a, const Part& b) { return a.per_byte < b.per_byte; });
  for (const Part& p : parts) {
    const double x = std::min(p.bytes, over / (1 + r.slack));
    if (x <= 0) continue;
    over -= x * (1 + r.slack);
    s.bytes += x * (1 + r.slack);
    switch (p.kind) {
      case 0:
        s.step += 2 * x;
        break;
      case 1:
        s.forward += x;
        s.backward += (r.passes - 1) * x;
        s.step += x;
        break;
      case 2:
        s.backward += 2 * x;
        break;
      default: {
        const double share = x / r.activations;  // of every micro-batch's activations
        s.forward += share * r.act_one;
        s.backward += share * r.act_one;
      }
    }
  }
  // What is left over (the working set, the process, the allocator's slack) cannot leave the
  // fast memory.
  s.fits = over <= 1e-9 * r.total && s.bytes <= capacity;
  return s;
}

}  // namespace troupe::plan::detail
