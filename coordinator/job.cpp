#include "coordinator/job.hpp"

namespace troupe::coord {

const char* to_string(JobState s) {
  switch (s) {
    case JobState::queued:
      return "queued";
    case JobState::planning:
      return "planning";
    case JobState::launching:
      return "launching";
    case JobState::running:
      return "running";
    case JobState::recovering:
      return "recovering";
    case JobState::succeeded:
      return "succeeded";
    case JobState::failed:
      return "failed";
    case JobState::cancelled:
      return "cancelled";
  }
  return "?";
}

bool is_terminal(JobState s) {
  return s == JobState::succeeded || s == JobState::failed || s == JobState::cancelled;
}

bool transition_allowed(JobState from, JobState to) {
  if (is_terminal(from)) return false;
  if (to == JobState::failed || to == JobState::cancelled) return true;
  switch (from) {
    case JobState::queued:
      return to == JobState::planning;
    case JobState::planning:
      return to == JobState::launching || to == JobState::queued;
    case JobState::launching:
      return to == JobState::running || to == JobState::recovering;
    case JobState::running:
      return to == JobState::succeeded || to == JobState::recovering;
    case JobState::recovering:
      return to == JobState::launching;
    default:
      return false;
  }
}

IllegalTransition::IllegalTransition(JobState from, JobState to)
    : msg_(std::string("illegal job transition ") + to_string(from) + " -> " + to_string(to)) {}

}  // namespace troupe::coord
