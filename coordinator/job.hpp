// A job's life as a state machine.
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

#include "core/layout.hpp"

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

using troupe::Layout;  // core/layout.hpp

}  // namespace troupe::coord
