#include "coordinator/job.hpp"

#include <algorithm>

#include "core/error.hpp"

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

std::string Layout::str() const {
  return std::to_string(dp) + "x" + std::to_string(pp) + "x" + std::to_string(tp);
}

RankCoords rank_coords(const Layout& layout, int rank, int n_layers) {
  TROUPE_CHECK(layout.dp > 0 && layout.pp > 0 && layout.tp > 0, "bad layout ", layout.str());
  TROUPE_CHECK(rank >= 0 && rank < layout.world(), "rank ", rank, " outside world ", layout.world());
  RankCoords c;
  c.tp_index = rank % layout.tp;
  c.dp_index = (rank / layout.tp) % layout.dp;
  c.pp_index = rank / (layout.tp * layout.dp);
  int base = n_layers / layout.pp, extra = n_layers % layout.pp, s = c.pp_index;
  c.first_layer = s * base + std::min(s, extra);
  c.last_layer = c.first_layer + base + (s < extra ? 1 : 0);
  return c;
}

}  // namespace troupe::coord
