// A job's life as a state machine, and the rank arithmetic of its layout.
//
//   queued ──> planning ──> launching ──> running ──> succeeded
//     │           │            │  ▲          │
//     │           │            ▼  │          ▼
//     │           │          recovering <────┘   (a rank failed, or a resize)
//     │           │            │
//     └───────────┴────────────┴──────────────────> failed | cancelled
//
// A queued job that does not fit stays queued, with the reason in its status.
// A recovering job has aborted its generation and waits (backoff, devices)
// before it relaunches the next generation from its newest checkpoint.
#pragma once

#include <exception>
#include <string>

namespace troupe::coord {

enum class JobState { queued, planning, launching, running, recovering, succeeded, failed, cancelled };

const char* to_string(JobState s);
bool is_terminal(JobState s);
bool transition_allowed(JobState from, JobState to);

// Thrown for a transition the diagram above does not have.
class IllegalTransition : public std::exception {
 public:
  IllegalTransition(JobState from, JobState to);
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int world() const { return dp * pp * tp; }
  std::string str() const;  // "2x1x1" (dp x pp x tp)
};

// Grid coordinates of one rank. Tensor parallelism varies fastest (its ranks
// share a host when they can), then data, then pipeline:
//   rank = pp_index * (dp * tp) + dp_index * tp + tp_index
// Worked example, dp=2 pp=2 tp=2: rank 5 = pp 1, dp 0, tp 1; the tensor group
// of rank 5 is {4, 5}, its data group {5, 7}, its pipeline group {1, 5}.
struct RankCoords {
  int dp_index = 0, pp_index = 0, tp_index = 0;
  int first_layer = 0, last_layer = 0;  // this stage's layers [first, last)
};

// Pipeline stage s of pp holds layers [s*L/pp + min(s, L%pp) ...): earlier
// stages take the remainder, so stage sizes differ by at most one.
RankCoords rank_coords(const Layout& layout, int rank, int n_layers);

}  // namespace troupe::coord
