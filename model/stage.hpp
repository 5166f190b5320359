// A pipeline stage of a GPT, MLP or llama model: optional embedding, a contiguous range of
// blocks, optional head (ln_f + LM head tied to wte, or llama's own lm_head + cross-entropy).
// A llama under tensor parallelism splits the embedding and the head by vocabulary rows:
// the lookup is summed over the shards and the loss combines each shard's softmax
// statistics, so no shard ever holds the full (B,T,V) logits. The
// single-device model is Stage(cfg, LayerRange::full(cfg.n_layer), ...).
//
// Activations live in n_slots independent micro-batch slots, allocated once for
// (max_micro_batch, cfg.seq_len); a call may use any B <= max_micro_batch and
// T <= seq_len. forward(slot) keeps what backward(slot) needs until the slot is
// forwarded again; backward runs one slot at a time and accumulates into the grads.
//
// Chaining stages by hand (what the pipeline executor does over the wire):
//   s0.forward(m, tokens, nullptr, nullptr, B, T);                 // has_embedding
//   double loss = s1.forward(m, nullptr, s0.output(m).f32(), targets, B, T);  // has_head
//   s1.backward(m, nullptr, 1.0f / (B * T));
//   s0.backward(m, s1.input_grad(m).f32(), 0.0f);
// With a split of the tied embedding, both the first and the last stage hold
// wte.weight; their grads must be summed (and values kept equal) between them.
//
// Split backward (zero-bubble schedules): per micro-batch slot, forward(m) ...
// backward_input(m, dout, dloss) ... backward_weights(m) does what backward(m, dout, dloss)
// does, in two parts: B, what the previous stage waits for (input_grad(m)), and later W,
// the Linears' weight-gradient products. W's in the order the backward()s would have run
// leave the grads bit for bit as backward() does; B keeps every tensor-parallel
// communication, W has none. Not with recomputation (W needs each block's internals).
//
// Tensor parallelism: Stage(cfg, range, n_slots, max_B, TensorShard{t, tp}, group) holds
// shard t's parameters (model/params.hpp) and runs the blocks' allreduces over `group`
// (rank t of tp ranks, used by this stage's thread only, kept alive by the caller).
// Every shard of a stage is called with the same inputs, in the same order (forward and
// backward are collective over the group), and returns the same loss, output and
// input_grad; the replicated parameters' grads are the same on every shard.
//
// Device and precision: a stage computes through a DeviceContext (model/device_context.hpp):
// its kernel table, the allocator of its activations and the compute dtype of its
// weights. Left out, it is DeviceContext::cpu() (fp32 on CPU). A CPU context with
// compute dtype bf16 or f16 trains in mixed precision (model/layers.hpp says what
// computes in which dtype); after the master weights change (an optimizer step, a
// load) the caller refreshes their compute copy, store().refresh_compute(). On a
// device (a CUDA context: kernels::cuda_kernels(), its allocator) parameters,
// gradients and activations live in device memory: tokens, targets, x_in and dout are
// host memory, copied in through the context's allocator; output(), input_grad() and
// logits() are device tensors (ParamStore::download and the allocator's copy_to_host
// read them). Tensor parallelism runs on the CPU only (its collectives take host memory).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.hpp"
#include "model/config.hpp"
#include "model/device_context.hpp"
#include "model/layers.hpp"
#include "model/params.hpp"

namespace troupe::model {

class Stage {
 public:
  Stage(const ModelConfig& cfg, const LayerRange& range, int n_slots = 1, int max_micro_batch = 1,
        const DeviceContext& ctx = DeviceContext::cpu());
  // Tensor shard `shard` over `tp_group` (null, or unused, when shard.size == 1).
  Stage(const ModelConfig& cfg, const LayerRange& range, int n_slots, int max_micro_batch,
        const TensorShard& shard, comm::Communicator* tp_group,
        const DeviceContext& ctx = DeviceContext::cpu());
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // tokens(B,T) int32 in [0,V) when has_embedding (else null); x_in(B,T,D) otherwise
  // (copied, the caller may reuse it). targets(B,T) int32 when has_head: returns the
  // SUM of the B*T per-token losses (double). targets == null with has_head computes
  // logits(slot) only and returns 0. Without a head, the result is output(slot), returns 0.
  double forward(int slot, const int32_t* tokens, const float* x_in, const int32_t* targets, int B, int T);

  // dout(B,T,D) = dL/d output(slot) when !has_head (else null). With has_head, dloss is
  // dL/d(each token's loss), e.g. 1/(global tokens), and the slot must have had targets.
  // Accumulates into every parameter grad; when !has_embedding, input_grad(slot) =
  // dL/d x_in (overwritten).
  //
  // on_ready (optional) is told which floats of store().flat_grads() this call has
  // finished writing, as they finish: after the head, after each block (in reverse) and
  // after the embedding. The ranges are contiguous and walk from the end of the buffer
  // to its start, padding included, so together they cover [0, flat numel) once; a
  // caller may ship [first_float, end) of the last accumulation while the rest runs.
  using ReadyFn = std::function<void(size_t first_float, size_t end_float)>;
  void backward(int slot, const float* dout, float dloss, const ReadyFn& on_ready = {});

  // B of a split backward: everything backward() does except the Linear weight-gradient
  // products (dW += dy^T x): input_grad(slot), biases, norms and embedding grads are as
  // backward() leaves them; each Linear's output gradient dy is kept in the slot (f32) for
  // backward_weights(slot). The slot may not be forwarded again before backward_weights(slot).
  // The head's dy, dlogits (B,T,V), is not kept: W recomputes it from the slot's logits
  // and dloss, as backward() does. One exception to "embedding grads in B": on a stage with
  // both the embedding and the tied head (wte read by both) they wait for W, after the
  // head's product, the order backward() adds the two into wte in (and nothing waits for
  // such a stage's B). Throws troupe::Error under cfg.recompute.
  void backward_input(int slot, const float* dout, float dloss);
  // W: the deferred weight-gradient products of the slot, each the same kernel call
  // backward() makes. Per micro-batch, backward_input then backward_weights leaves every
  // gradient bit-identical to backward(); over several micro-batches, W's in the same
  // micro-batch order as the backward()s would have been give bit-identical accumulated grads.
  void backward_weights(int slot);
  // Bytes of the kept output gradients (allocated on the first backward_input, per slot; 0 before).
  size_t deferred_bytes() const;

  Tensor output(int slot) const;  // (B,T,D) view, valid after forward(slot), !has_head
  // (B,T,D) view, valid after backward(slot) or backward_input(slot), !has_embedding
  Tensor input_grad(int slot) const;
  // (B,T,Vl) view, valid after forward(slot), has_head: the vocabulary columns of this
  // shard (all V, except for a llama under tensor parallelism: V/tp from shard*V/tp).
  Tensor logits(int slot) const;

  // Sampling: logits(V) of the last position of prefix tokens(T), B=1, T <= seq_len.
  // Needs the full model (embedding and head); uses slot 0.
  void last_logits(const int32_t* tokens, int T, float* out);

  std::vector<Param>& params() { return store_.params(); }
  const std::vector<Param>& params() const { return store_.params(); }
  Param& param(const std::string& name) { return store_.get(name); }
  ParamStore& store() { return store_; }
  const ParamStore& store() const { return store_; }
  void zero_grads() { store_.zero_grads(); }
  int64_t num_params() const { return store_.num_params(); }

  const ModelConfig& config() const { return cfg_; }
  const DeviceContext& device_context() const { return ctx_; }
  const LayerRange& range() const { return range_; }
  const TensorShard& tensor_shard() const { return tp_.shard; }
  const TensorGroup& tensor_group() const { return tp_; }
  int n_slots() const { return static_cast<int>(slots_.size()); }
  int max_micro_batch() const { return max_B_; }

 private:
  struct Slot {
    int B = 0, T = 0;
    bool forwarded = false, has_targets = false;
    bool weights_pending = false;    // between backward_input and backward_weights
    float dloss = 0.0f;              // backward_input's, for W's recomputed dlogits
    Tensor tokens, targets;          // (B,T) int32
    std::vector<Tensor> resid;       // n_blocks + 1 of (B,T,D): stage input, then each block's output
    Tensor lnf, lnf_mean, lnf_rstd;  // (B,T,D), (B,T), (B,T)
    Tensor logits;                   // (B,T,Vl): this shard's vocabulary columns (all V but llama's tp > 1)
    Tensor lse;                      // (B,T) log-sum-exp of each row's logits over every shard (llama)
    Tensor dinput;                   // (B,T,D)
    Tensor dembed;                   // (max N,D) the embedding's gradient kept for W (embedding_after_head)
  };

  ModelConfig cfg_;
  LayerRange range_;
  DeviceContext ctx_;
  const kernels::Kernels* k_;
  TensorGroup tp_;
  int max_B_;
  ParamStore store_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Slot> slots_;
  Workspace ws_;
  Tensor dlogits_;       // (B,T,V) head backward scratch
  Tensor dlogits_h_;     // (B,T,V) the same in the compute dtype (mixed precision only)
  Linear head_;          // weight = wte (tied) or lm_head (untied llama), no bias
  LayerNorm ln_f_;       // gpt, mlp
  RmsNorm rms_f_;        // llama
  int v0_ = 0, Vl_ = 0;  // vocabulary rows [v0_, v0_ + Vl_) of the embedding and the head on this shard
  Tensor ce_stats_;      // ((2*tp+1)*B*T) vocabulary-parallel loss statistics (llama)
  // On a device: the host copies the loss combines, the statistics then the rows' log-sum-exp.
  std::vector<float> host_ce_;
  float *wte_ = nullptr, *dwte_ = nullptr, *wpe_ = nullptr, *dwpe_ = nullptr;
  // Flat-gradient offsets where the head's parameters (ln_f, the tied wte of a head-only
  // stage) and each block begin; the head's run ends at the buffer's end and the
  // embedding's (wte, wpe of the first stage) starts at 0.
  size_t head_begin_ = 0;
  std::vector<size_t> block_begin_;

  Slot& slot_at(int slot);
  // backward, or with split backward_input: one code path for both.
  void backward_pass(int slot, const float* dout, float dloss, const ReadyFn& on_ready, bool split);
  // dlogits (N,Vl) of the slot's saved logits into dlogits_.
  const float* head_output_grad(Slot& s, int N, float dloss);
  // The embedding's grads (wte, and wpe for gpt) from dres(N,D) = dL/d(its output).
  void embedding_backward(const Slot& s, const float* dres);
  // wte takes both the head's product and the embedding's rows on this stage.
  bool embedding_after_head() const { return range_.has_embedding && range_.has_head && cfg_.tied_head(); }
  // Sum of the N rows' losses from this shard's logits columns and the other shards'
  // statistics; saves each row's log-sum-exp for backward.
  double vocab_parallel_loss(Slot& s, int N);
};

}  // namespace troupe::model
