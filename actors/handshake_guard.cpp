#include "actors/handshake_guard.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace troupe::actors {

PendingHandshakes::Id PendingHandshakes::admit(const std::string& address, Clock::time_point now,
                                               std::vector<Id>* evict) {
  const std::string key = address_key(address);
  for (auto mine = by_address_.find(key);
       mine != by_address_.end() && int(mine->second.size()) >= std::max(1, limits_.per_address);
       mine = by_address_.find(key)) {
    const Id oldest = mine->second.front();
    evict->push_back(oldest);
    erase(entries_.at(oldest).second);
  }
  while (!order_.empty() && int(order_.size()) >= std::max(1, limits_.total)) {
    const Id oldest = order_.front();
    evict->push_back(oldest);
    erase(entries_.at(oldest).second);
  }
  const Id id = next_++;
  order_.push_back(id);
  entries_.emplace(id, std::make_pair(Entry{key, now}, std::prev(order_.end())));
  by_address_[key].push_back(id);
  return id;
}

void PendingHandshakes::erase(std::list<Id>::iterator it) {
  const Id id = *it;
  auto e = entries_.find(id);
  auto a = by_address_.find(e->second.first.address);
  a->second.remove(id);  // a handful per address: per_address bounds the list
  if (a->second.empty()) by_address_.erase(a);
  order_.erase(it);
  entries_.erase(e);
}

void PendingHandshakes::established(Id id) {
  auto e = entries_.find(id);
  if (e != entries_.end()) erase(e->second.second);
}

std::vector<PendingHandshakes::Id> PendingHandshakes::expired(Clock::time_point now) {
  std::vector<Id> out;
  while (!order_.empty() && now - entries_.at(order_.front()).first.since >= limits_.deadline) {
    out.push_back(order_.front());
    erase(order_.begin());
  }
  return out;
}

size_t PendingHandshakes::pending(const std::string& address) const {
  auto a = by_address_.find(address_key(address));
  return a == by_address_.end() ? 0 : a->second.size();
}

int raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 1u << 30 ? 1 << 30 : static_cast<int>(r.rlim_cur);
}

DescriptorCursor::DescriptorCursor(int first, int end)
    : first_(std::max(first, 3)), end_(end > 0 ? end : raise_descriptor_limit()), next_(first_) {
  // A small limit (a hard limit of 1,024, say): the upper half of it, still a turn of hundreds.
  if (end <= 0 && end_ < 2 * first_) next_ = first_ = std::max(3, end_ / 2);
}

int DescriptorCursor::place(int fd) {
  for (int turn = 0; turn < 2; ++turn) {
    if (next_ < first_ || next_ >= end_) next_ = first_;
    if (next_ >= end_) return fd;  // no room above `first`
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, next_);
    if (moved >= 0 && moved < end_) {
      ::close(fd);
      next_ = moved + 1;
      return moved;
    }
    if (moved >= 0) ::close(moved);  // past `end` (a limit raised since): start the turn again
    next_ = end_;                    // none free from next_ on: wrap
  }
  return fd;
}

}  // namespace troupe::actors
