#include "worker/memory_snapshot.hpp"

#include <xxhash.h>

namespace troupe {

int64_t RankState::bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += int64_t(t.capacity() * sizeof(float));
  return n;
}

uint64_t state_checksum(const RankState& s) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(st, p, n); };
  add(&s.next_step, sizeof s.next_step);
  add(s.fingerprint.data(), s.fingerprint.size());
  const int64_t head[3] = {s.rank, s.replicated ? 1 : 0, int64_t(s.tensors.size())};
  add(head, sizeof head);
  const double scale[3] = {s.loss_scale.scale, double(s.loss_scale.clean_steps),
                           double(s.loss_scale.skipped_steps)};
  add(scale, sizeof scale);
  for (const auto& t : s.tensors) {
    const uint64_t n = t.size();
    add(&n, sizeof n);
    add(t.data(), t.size() * sizeof(float));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

RankState& MemorySnapshots::begin() {
  RankState& s = slots_[0].next_step <= slots_[1].next_step ? slots_[0] : slots_[1];
  s.next_step = -1;
  return s;
}

void MemorySnapshots::commit(RankState& slot, int64_t next_step) { slot.next_step = next_step; }

const RankState* MemorySnapshots::find(int64_t next_step) const {
  for (const auto& s : slots_)
    if (next_step >= 0 && s.next_step == next_step) return &s;
  return nullptr;
}

std::vector<int64_t> MemorySnapshots::held() const {
  std::vector<int64_t> out;
  const int newer = slots_[0].next_step >= slots_[1].next_step ? 0 : 1;
  for (int i : {newer, 1 - newer})
    if (slots_[i].next_step >= 0) out.push_back(slots_[i].next_step);
  return out;
}

bool MemorySnapshots::replicated() const {
  const RankState& newest = slots_[0].next_step >= slots_[1].next_step ? slots_[0] : slots_[1];
  return newest.next_step >= 0 && newest.replicated;
}

int MemorySnapshots::rank() const {
  const RankState& newest = slots_[0].next_step >= slots_[1].next_step ? slots_[0] : slots_[1];
  return newest.next_step >= 0 ? newest.rank : -1;
}

int64_t MemorySnapshots::bytes() const { return slots_[0].bytes() + slots_[1].bytes(); }

void MemorySnapshots::keep_only(int64_t next_step) {
  for (auto& s : slots_)
    if (s.next_step != next_step || next_step < 0) s = RankState{};
}

void MemorySnapshots::clear() {
  for (auto& s : slots_) s = RankState{};
}

}  // namespace troupe
