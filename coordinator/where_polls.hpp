// How often the coordinator asks each rank "where are you" (coordinator_actor.cpp asks; the
// step watchdog in state_recovery.cpp judges an answer stale by it).
//
// Ranks are asked in turn, a share of them at every tick: each rank every kWherePeriodMs while
// that makes at most kWherePollsPerSecond polls, else that many per second. A poll is a
// request, its answer and a timer on the coordinator's actor: at 4,096 ranks every 500 ms it
// was 8,192 of each per second, in bursts of 4,096. The ranks whose relays live on their
// agent's node are asked through the agent, one request for the ranks of its host that a tick
// reaches (coordinator_actor.cpp, poll_where): a poll of the share is then a host, and
// kWhereRanksPerTick still bounds the ranks a tick asks, so that every rank is asked at least
// as often as where_round_ms says (the step watchdog's measure).
#pragma once

#include <algorithm>
#include <cstddef>

namespace troupe::coord {

constexpr size_t kWhereTickMs = 100;  // the coordinator's tick
constexpr size_t kWherePeriodMs = 500;
constexpr size_t kWherePollsPerSecond = 4096;
constexpr size_t kWhereRanksPerTick = kWherePollsPerSecond * kWhereTickMs / 1000;

// How many polls one tick makes, out of `targets` asked in turn (ranks; or hosts and the ranks
// connected by themselves).
inline size_t where_polls_per_tick(size_t targets) {
  constexpr size_t ticks_per_period = kWherePeriodMs / kWhereTickMs;
  return std::clamp<size_t>((targets + ticks_per_period - 1) / ticks_per_period, 1, kWhereRanksPerTick);
}

// How long every one of `ranks` ranks waits between two polls: at most kWherePeriodMs up to
// 2,045 ranks, then in proportion (1.1 s at 4,096, 4.1 s at 16,384).
inline double where_round_ms(size_t ranks) {
  const size_t per_tick = where_polls_per_tick(ranks);
  return static_cast<double>(std::max<size_t>(1, (ranks + per_tick - 1) / per_tick) * kWhereTickMs);
}

}  // namespace troupe::coord
