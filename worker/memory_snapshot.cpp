#include "worker/memory_snapshot.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace troupe {

namespace {

// Each tensor starts at a 64-byte boundary of the block.
constexpr size_t kAlign = 64 / sizeof(float);

size_t block_floats(const std::vector<size_t>& sizes, std::vector<size_t>* at) {
  size_t end = 0;
  for (size_t n : sizes) {
    end = (end + kAlign - 1) / kAlign * kAlign;
    if (at) at->push_back(end);
    end += n;
  }
  return end;
}

}  // namespace

RankState& RankState::operator=(RankState&& o) noexcept {
  if (this == &o) return *this;
  next_step = std::exchange(o.next_step, -1);
  fingerprint = std::move(o.fingerprint);
  tensors = std::move(o.tensors);  // the views follow the storage, which moves with them
  loss_scale = o.loss_scale;
  replicated = o.replicated;
  rank = std::exchange(o.rank, -1);
  checksum = std::exchange(o.checksum, 0);
  own_ = std::move(o.own_);
  seg_ = std::move(o.seg_);
  slot_ = std::exchange(o.slot_, -1);
  in_segment_ = std::exchange(o.in_segment_, false);
  o.tensors.clear();
  o.own_.clear();
  o.seg_.reset();
  return *this;
}

void RankState::place(std::shared_ptr<SnapshotSegment> seg, int slot) {
  tensors.clear();  // no view outlives the storage it pointed into
  seg_ = std::move(seg);
  slot_ = seg_ ? slot : -1;
  in_segment_ = false;
}

void RankState::shape(const std::vector<size_t>& sizes) {
  std::vector<size_t> at;
  const size_t total = block_floats(sizes, &at);
  float* base = nullptr;
  if (seg_ && seg_->owned() && slot_ >= 0 && total * sizeof(float) <= seg_->slot_bytes()) {
    base = seg_->slot(slot_);
    in_segment_ = true;
    std::vector<float>().swap(own_);
  } else {
    in_segment_ = false;
    own_.resize(total);
    base = own_.data();
  }
  tensors.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) tensors[i] = TensorView{base + at[i], sizes[i]};
}

bool RankState::attach(std::shared_ptr<SnapshotSegment> seg, int slot, const std::vector<size_t>& sizes) {
  std::vector<size_t> at;
  const size_t total = block_floats(sizes, &at);
  if (!seg || slot < 0 || slot > 1 || total > seg->slot_bytes() / sizeof(float)) return false;
  seg_ = std::move(seg);
  slot_ = slot;
  in_segment_ = true;
  std::vector<float>().swap(own_);
  float* base = seg_->slot(slot);
  tensors.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) tensors[i] = TensorView{base + at[i], sizes[i]};
  return true;
}

bool RankState::stale() const {
  return in_segment_ && seg_ && !seg_->owned() && seg_->step(slot_) != next_step;
}

void RankState::set_step(int64_t step) {
  next_step = step;
  if (in_segment_ && seg_ && seg_->owned()) seg_->set_step(slot_, step);
}

int64_t RankState::bytes() const {
  if (in_segment_ && seg_) return seg_->owned() ? int64_t(seg_->slot_bytes()) : 0;
  return int64_t(own_.capacity() * sizeof(float));
}

namespace {

// state_checksum's order: the step, the fingerprint, rank, replicated, the tensor count, the loss
// scale, then each tensor's size and bytes.
XXH3_state_t* hash_head(const RankState& s, int64_t next_step) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &next_step, sizeof next_step);
  XXH3_64bits_update(st, s.fingerprint.data(), s.fingerprint.size());
  const int64_t head[3] = {s.rank, s.replicated ? 1 : 0, int64_t(s.tensors.size())};
  XXH3_64bits_update(st, head, sizeof head);
  const double scale[3] = {s.loss_scale.scale, double(s.loss_scale.clean_steps),
                           double(s.loss_scale.skipped_steps)};
  XXH3_64bits_update(st, scale, sizeof scale);
  return st;
}

uint64_t digest(XXH3_state_t* st) {
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

uint64_t state_checksum(const RankState& s) {
  XXH3_state_t* st = hash_head(s, s.next_step);
  for (const auto& t : s.tensors) {
    const uint64_t n = t.size();
    XXH3_64bits_update(st, &n, sizeof n);
    XXH3_64bits_update(st, t.data(), t.size() * sizeof(float));
  }
  return digest(st);
}

uint64_t copy_into(RankState& s, const std::vector<const float*>& from, int64_t next_step) {
  // Pieces small enough to be hashed from the cache they were just written to.
  constexpr size_t kPiece = (size_t(256) << 10) / sizeof(float);
  if (from.size() != s.tensors.size())
    throw std::invalid_argument("copy_into: " + std::to_string(from.size()) + " sources for " +
                                std::to_string(s.tensors.size()) + " tensors");
  XXH3_state_t* st = hash_head(s, next_step);
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const TensorView& t = s.tensors[i];
    const uint64_t n = t.size();
    XXH3_64bits_update(st, &n, sizeof n);
    for (size_t at = 0; at < t.size(); at += kPiece) {
      const size_t len = std::min(kPiece, t.size() - at) * sizeof(float);
      std::memcpy(t.data() + at, from[i] + at, len);
      XXH3_64bits_update(st, t.data() + at, len);
    }
  }
  return digest(st);
}

RankState& MemorySnapshots::begin() {
  const int i = slots_[0].next_step <= slots_[1].next_step ? 0 : 1;
  RankState& s = slots_[i];
  s.set_step(-1);  // a buddy mapping the slot stops counting it before a byte changes
  s.place(seg_, i);
  return s;
}

void MemorySnapshots::commit(RankState& slot, int64_t next_step) { slot.set_step(next_step); }

const RankState* MemorySnapshots::find(int64_t next_step) const {
  for (const auto& s : slots_)
    if (next_step >= 0 && whole(s) && s.next_step == next_step) return &s;
  return nullptr;
}

std::vector<int64_t> MemorySnapshots::held() const {
  std::vector<int64_t> out;
  const int newer = slots_[0].next_step >= slots_[1].next_step ? 0 : 1;
  for (int i : {newer, 1 - newer})
    if (whole(slots_[i])) out.push_back(slots_[i].next_step);
  return out;
}

const RankState* MemorySnapshots::newest() const {
  const RankState* best = nullptr;
  for (const auto& s : slots_)
    if (whole(s) && (!best || s.next_step > best->next_step)) best = &s;
  return best;
}

bool MemorySnapshots::replicated() const {
  const RankState* s = newest();
  return s && s->replicated;
}

int MemorySnapshots::rank() const {
  const RankState* s = newest();
  return s ? s->rank : -1;
}

int64_t MemorySnapshots::bytes() const { return slots_[0].bytes() + slots_[1].bytes(); }

void MemorySnapshots::drop(RankState& s) {
  s.set_step(-1);
  s = RankState{};
}

void MemorySnapshots::keep_only(int64_t next_step) {
  for (auto& s : slots_)
    if (s.next_step != next_step || next_step < 0) drop(s);
}

void MemorySnapshots::clear() {
  for (auto& s : slots_) drop(s);
}

}  // namespace troupe
