// Device staging: what crosses between the rank's device and host memory outside the layers
// (a CPU rank reads and writes in place): the offloaded optimizer's copies, NCCL's scalar
// reductions, the host buffers a checkpoint snapshot reads device tensors from, and the
// CUDA device of the calling thread.
#include <string>

#include "worker/device.hpp"
#include "worker/engine_impl.hpp"

namespace troupe {

// The CUDA device of this rank for the calling thread (steps, evaluations and checkpoints
// may run on another thread than the one that built the engine).
void Engine::Impl::use_device() const { worker::use_device(spec.resources.device, asg.comm.device); }

// One AdamW update: on the device, or under offload on the host copies (gradients copied
// out, master weights copied back in).
void Engine::Impl::optimizer_step(double lr, int64_t t) {
  if (host_master.empty()) return opt->step(lr, t);
  for (size_t i = 0; i < refs.size(); ++i)
    ctx.alloc->copy_to_host(host_grad[i].data(), refs[i].grad, refs[i].numel * sizeof(float));
  opt->step(lr, t);
  for (size_t i = 0; i < refs.size(); ++i)
    ctx.alloc->copy_from_host(refs[i].data, host_master[i].data(), refs[i].numel * sizeof(float));
}

// A host double reduced over a group: in place for gloo; for NCCL, which reduces device
// memory only, through a device scratch (the copies wait for the compute stream).
void Engine::Impl::scalar_allreduce(comm::Communicator& c, double* v, comm::ReduceOp op) {
  if (!nccl(c)) return c.allreduce(v, 1, op, copt);
  if (!scalar_scratch.defined()) scalar_scratch = Tensor::zeros({1}, DType::f64, *ctx.alloc);
  ctx.alloc->copy_from_host(scalar_scratch.data(), v, sizeof *v);
  c.allreduce(scalar_scratch.data(), 1, DType::f64, op, copt);
  ctx.alloc->copy_to_host(v, scalar_scratch.data(), sizeof *v);
}

// Host memory a snapshot reads a device tensor from (pinned on a GPU): one buffer per
// tensor (slot: 3 per parameter, its values and both moments), made at the first
// checkpoint and reused. A CPU tensor is read in place.
const float* Engine::Impl::host_view(const Tensor& t, size_t slot) const {
  if (t.device() == Device::cpu) return t.f32();
  if (staging.size() <= slot) staging.resize(slot + 1);
  Tensor& h = staging[slot];
  if (h.numel() != t.numel())
    h = Tensor::empty({t.numel()}, DType::f32, worker::staging_allocator(spec.resources.device));
  ctx.alloc->copy_to_host(h.data(), t.data(), t.nbytes());
  return h.f32();
}

}  // namespace troupe
