#include "parallel/zero.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.hpp"

namespace troupe::parallel {

namespace {

size_t part_floats(size_t count, int dp) { return (count + size_t(dp) - 1) / size_t(dp); }

void check_group(const comm::Communicator& group, int dp, int d, const char* what) {
  TROUPE_CHECK(group.size() == dp && group.rank() == d, what, ": the partition is rank ", d, " of ", dp,
               " but the group is rank ", group.rank(), " of ", group.size());
}

// Copies the parameter-local floats [lo, hi) (src[0] is float lo) that fall in local
// indices [begin, end) along `dim` of a row-major tensor of `shape` into dst, which holds
// that block in copy_block's layout: per index of the dims before `dim` ("outer"), the
// run [begin, end) x inner is contiguous in the tensor and in dst.
//   shape (4, 6), dim 1, [2, 5): outer 4, ext 6, inner 1; row o of the tensor, floats
//   [6o+2, 6o+5), goes to dst [3o, 3o+3)
void fill_block(const float* src, size_t lo, size_t hi, const Shape& shape, int dim, int64_t begin,
                int64_t end, float* dst) {
  size_t outer = 1, ext = 1, inner = 1;  // a 0-d tensor: one index along its one "dim"
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t e = size_t(shape[i]);
    if (int(i) < dim) outer *= e;
    if (int(i) == dim) ext = e;
    if (int(i) > dim) inner *= e;
  }
  const size_t n = size_t(end - begin), row = ext * inner;
  if (n == 0 || lo >= hi || row == 0) return;
  const size_t o_end = std::min(outer, (hi + row - 1) / row);
  for (size_t o = lo / row; o < o_end; ++o) {
    const size_t first = o * row + size_t(begin) * inner;  // the block's run in row o
    const size_t a = std::max(lo, first), b = std::min(hi, first + n * inner);
    if (a < b) std::memcpy(dst + o * n * inner + (a - first), src + (a - lo), (b - a) * sizeof(float));
  }
}

}  // namespace

std::pair<size_t, size_t> bucket_part(size_t count, int dp, int d) {
  TROUPE_CHECK(dp >= 1 && d >= 0 && d < dp, "bucket part ", d, " of ", dp, " ranks");
  const size_t chunk = part_floats(count, dp);
  const size_t begin = std::min(size_t(d) * chunk, count);
  return {begin, std::min(begin + chunk, count)};
}

std::vector<std::pair<size_t, size_t>> buckets_of(size_t n, size_t bucket) {
  TROUPE_CHECK(bucket > 0, "bucket size must be positive");
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t end = n; end > 0; end = bucket_begin(end, bucket))
    out.emplace_back(bucket_begin(end, bucket), end);
  return out;
}

void reduce_scatter_bucket(comm::Communicator& group, float* g, size_t count, std::vector<float>& scratch,
                           const comm::Options& opt, Allocator& alloc) {
  const int dp = group.size();
  if (dp == 1 || count == 0) return;  // the same count on every rank: all skip together
  const size_t chunk = part_floats(count, dp), padded = chunk * size_t(dp);
  const auto [begin, end] = bucket_part(count, dp, group.rank());
  const float* sum = nullptr;
  if (padded == count) {
    if (scratch.size() < chunk) scratch.resize(chunk);
    group.reduce_scatter(g, scratch.data(), chunk, comm::ReduceOp::sum, opt);
    sum = scratch.data();
  } else {
    // reduce_scatter takes dp equal parts: the bucket, zeros after it, then the output.
    if (scratch.size() < padded + chunk) scratch.resize(padded + chunk);
    std::memcpy(scratch.data(), g, count * sizeof(float));
    std::fill(scratch.begin() + std::ptrdiff_t(count), scratch.begin() + std::ptrdiff_t(padded), 0.0f);
    group.reduce_scatter(scratch.data(), scratch.data() + padded, chunk, comm::ReduceOp::sum, opt);
    sum = scratch.data() + padded;
  }
  std::memcpy(g + begin, sum, (end - begin) * sizeof(float));
  alloc.release(g, begin * sizeof(float));
  alloc.release(g + end, (count - end) * sizeof(float));
}

void allgather_bucket(comm::Communicator& group, float* x, size_t count, std::vector<float>& scratch,
                      const comm::Options& opt) {
  const int dp = group.size(), d = group.rank();
  if (dp == 1 || count == 0) return;
  const size_t chunk = part_floats(count, dp), padded = chunk * size_t(dp);
  if (padded == count) {
    group.allgather(x + size_t(d) * chunk, x, chunk, opt);  // in place: the contract allows it
    return;
  }
  // The last parts are short or empty: every rank sends chunk floats from a padded copy.
  const auto [begin, end] = bucket_part(count, dp, d);
  if (scratch.size() < padded) scratch.resize(padded);
  float* mine = scratch.data() + size_t(d) * chunk;
  std::memcpy(mine, x + begin, (end - begin) * sizeof(float));
  std::fill(mine + (end - begin), mine + chunk, 0.0f);
  group.allgather(mine, scratch.data(), chunk, opt);
  std::memcpy(x, scratch.data(), count * sizeof(float));
}

ZeroPartition::ZeroPartition(const std::vector<model::Stage*>& stages, int dp, int d, size_t bucket_floats)
    : stages_(stages), dp_(dp), d_(d), bucket_floats_(bucket_floats) {
  TROUPE_CHECK(dp >= 1 && d >= 0 && d < dp, "ZeRO partition: rank ", d, " of ", dp);
  TROUPE_CHECK(bucket_floats > 0, "ZeRO partition: bucket size must be positive");
  for (size_t s = 0; s < stages_.size(); ++s) {
    TROUPE_CHECK(stages_[s], "ZeRO partition: stage ", s, " is null");
    const model::ParamStore& store = stages_[s]->store();
    const float* base = store.flat_params().f32();
    const size_t n = size_t(store.flat_params().numel());
    const auto& params = store.params();
    std::vector<Span>& spans = spans_.emplace_back(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const size_t numel = size_t(params[i].data.numel());
      if (numel > 0) spans[i] = {size_t(params[i].data.f32() - base), numel};
    }

    // This rank's parts, ascending: buckets go last first, parts lie inside their bucket.
    std::vector<std::pair<size_t, size_t>> parts;
    for (const auto& [b0, b1] : buckets_of(n, bucket_floats)) {
      const auto [p0, p1] = bucket_part(b1 - b0, dp, d);
      if (p1 > p0) parts.emplace_back(b0 + p0, b0 + p1);
    }
    std::reverse(parts.begin(), parts.end());

    std::vector<size_t> order(params.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a].flat < spans[b].flat; });
    size_t j = 0;  // the first part that may overlap the next parameter
    for (size_t i : order) {
      const size_t p0 = spans[i].flat, p1 = p0 + spans[i].numel;
      if (p1 == p0) continue;
      while (j < parts.size() && parts[j].second <= p0) ++j;
      for (size_t k = j; k < parts.size() && parts[k].first < p1; ++k) {
        const size_t a = std::max(p0, parts[k].first), b = std::min(p1, parts[k].second);
        if (a >= b) continue;
        Piece* last = pieces_.empty() ? nullptr : &pieces_.back();
        if (last && last->stage == s && last->param == i && last->flat + last->len == a)
          last->len += b - a;  // the next bucket's part continues this one (dp = 1)
        else
          pieces_.push_back({s, i, a, a - p0, b - a});
        owned_floats_ += b - a;
      }
    }
  }
}

std::vector<ParamRef> ZeroPartition::refs() const {
  std::vector<ParamRef> out;
  out.reserve(pieces_.size());
  for (const Piece& pc : pieces_) {
    model::Param& p = stages_[pc.stage]->params()[pc.param];
    out.push_back({p.name, p.data.f32() + pc.offset, p.grad.f32() + pc.offset, pc.len, p.decay});
  }
  return out;
}

void ZeroPartition::reduce_scatter_grads(comm::Communicator& group, const comm::Options& opt) {
  check_group(group, dp_, d_, "ZeRO reduce-scatter of gradients");
  for (model::Stage* st : stages_) {
    const Tensor& flat = st->store().flat_grads();
    for (const auto& [b0, b1] : buckets_of(size_t(flat.numel()), bucket_floats_))
      reduce_scatter_bucket(group, flat.f32() + b0, b1 - b0, scratch_, opt, *st->device_context().alloc);
  }
}

void ZeroPartition::release_grads() {
  for (model::Stage* st : stages_) {
    const Tensor& flat = st->store().flat_grads();
    st->device_context().alloc->release(flat.data(), flat.nbytes());
  }
}

void ZeroPartition::allgather_params(comm::Communicator& group, const comm::Options& opt) {
  check_group(group, dp_, d_, "ZeRO allgather of parameters");
  for (model::Stage* st : stages_) {
    const Tensor& flat = st->store().flat_params();
    for (const auto& [b0, b1] : buckets_of(size_t(flat.numel()), bucket_floats_))
      allgather_bucket(group, flat.f32() + b0, b1 - b0, scratch_, opt);
  }
}

void ZeroPartition::gather_moment_parts(comm::Communicator& group, const AdamW& opt,
                                        const std::vector<MomentPart>& want,
                                        const comm::Options& opt_comm) const {
  check_group(group, dp_, d_, "ZeRO gather of optimizer moments");
  TROUPE_CHECK(opt.params().size() == pieces_.size(), "ZeRO gather of optimizer moments: the optimizer has ",
               opt.params().size(), " parameters, the partition ", pieces_.size(), " pieces");
  for (const MomentPart& w : want) {
    TROUPE_CHECK(w.stage < stages_.size() && w.param < stages_[w.stage]->params().size(),
                 "ZeRO gather of optimizer moments: no parameter ", w.param, " in stage ", w.stage);
    const Shape& shape = stages_[w.stage]->params()[w.param].data.shape();
    const int ndim = int(shape.size());
    TROUPE_CHECK(w.dim >= 0 && w.dim < std::max(ndim, 1), "ZeRO gather of optimizer moments: dim ", w.dim,
                 " of a ", ndim, "-d parameter");
    const int64_t ext = ndim == 0 ? 1 : shape[size_t(w.dim)];
    TROUPE_CHECK(0 <= w.begin && w.begin <= w.end && w.end <= ext, "ZeRO gather of optimizer moments: [",
                 w.begin, ", ", w.end, ") along dim ", w.dim, " of extent ", ext);
    TROUPE_CHECK(w.begin == w.end || (w.m && w.v), "ZeRO gather of optimizer moments: no output buffer");
  }

  // One bucket of moments at a time, laid out as the flat buffer: this rank fills its part
  // (bucket_part) from its pieces, allgather_bucket brings the others'.
  std::vector<float> buf, scratch;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const size_t n = size_t(stages_[s]->store().flat_params().numel());
    for (const auto& [b0, b1] : buckets_of(n, bucket_floats_)) {
      const size_t count = b1 - b0;
      const auto [own0, own1] = bucket_part(count, dp_, d_);
      if (buf.size() < count) buf.resize(count);
      for (int which = 0; which < 2; ++which) {
        std::fill(buf.data() + own0, buf.data() + own1, 0.0f);  // padding between parameters
        for (size_t i = 0; i < pieces_.size(); ++i) {
          const Piece& pc = pieces_[i];
          const size_t a = std::max(pc.flat, b0), b = std::min(pc.flat + pc.len, b1);
          if (pc.stage != s || a >= b) continue;
          const Tensor& mom = which == 0 ? opt.m(i) : opt.v(i);
          std::memcpy(buf.data() + (a - b0), mom.f32() + (a - pc.flat), (b - a) * sizeof(float));
        }
        allgather_bucket(group, buf.data(), count, scratch, opt_comm);
        for (const MomentPart& w : want) {
          if (w.stage != s) continue;
          const Span& sp = spans_[s][w.param];
          const size_t a = std::max(sp.flat, b0), b = std::min(sp.flat + sp.numel, b1);
          if (a >= b) continue;
          fill_block(buf.data() + (a - b0), a - sp.flat, b - sp.flat,
                     stages_[s]->params()[w.param].data.shape(), w.dim, w.begin, w.end,
                     which == 0 ? w.m : w.v);
        }
      }
    }
  }
}

void ZeroPartition::load_param_moments(size_t stage, size_t param, const float* m_full, const float* v_full,
                                       AdamW& opt) const {
  TROUPE_CHECK(opt.params().size() == pieces_.size(), "ZeRO load of optimizer moments: the optimizer has ",
               opt.params().size(), " parameters, the partition ", pieces_.size(), " pieces");
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& pc = pieces_[i];
    if (pc.stage != stage || pc.param != param) continue;
    TROUPE_CHECK(size_t(opt.m(i).numel()) == pc.len && size_t(opt.v(i).numel()) == pc.len,
                 "ZeRO load of optimizer moments: ", opt.params()[i].name, " holds ", opt.m(i).numel(),
                 " floats, its piece ", pc.len);
    std::memcpy(opt.m(i).f32(), m_full + pc.offset, pc.len * sizeof(float));
    std::memcpy(opt.v(i).f32(), v_full + pc.offset, pc.len * sizeof(float));
  }
}

}  // namespace troupe::parallel
