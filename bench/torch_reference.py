#!/usr/bin/env python3
"""PyTorch reference for troupe's training throughput.

The same byte-level GPT as model/ (vocab 256, learned positions, pre-LayerNorm,
GELU-tanh MLP, LM head tied to wte), trained with AdamW on random tokens, on one
CPU thread unless told otherwise. Prints tokens/s after warm-up; the last line
is machine-readable for bench/train_throughput:

    tokens_per_s=<median-step figure> tokens_per_cpu_s=<figure> params=<count>
    params_no_wpe=<count> peak_rss_kib=<VmHWM> last_loss=<loss>

--autocast bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16):
the module's fp32 parameters are the master weights, AdamW and the clip see fp32
gradients, the products in between are bf16 (mixed precision as troupe's
train.precision: bf16).

--mm times torch.mm instead, fp32 and bf16, one line per dtype and shape:

    mm dtype=<fp32|bf16> M=<m> N=<n> K=<k> op=<NN|NT|TN> gflops=<median> best=<best>

Without torch the script prints "unavailable=no torch: <reason>" and exits with 3,
so that the benchmark can say why a column is missing.

--device cuda (bench/gpu_throughput) trains on the GPU: --autocast bf16 then autocasts on
"cuda", --sdpa runs attention as F.scaled_dot_product_attention(is_causal=True), --compile
wraps the model in torch.compile, AdamW is the fused one, every timed step ends in
torch.cuda.synchronize(), and the last line adds peak_device_bytes=<max_memory_allocated>.
--vocab sets the vocabulary (256 unless given; a GPT-2 size is 50257).

Configurations used in the reports:
    A: --layers 4 --d-model 256 --heads 4 --seq-len 128 --batch 16   (or --config A)
    B: --layers 8 --d-model 512 --heads 8 --seq-len 256 --batch 8    (or --config B)
    124m: GPT-2 small, 12 x 768, 12 heads, seq 1024, vocab 50257, batch 16
    1.3b: GPT-3 XL's shape, 24 x 2048, 16 heads, seq 1024, vocab 50257, batch 8
"""
import argparse
import math
import os
import statistics
import sys
import time


def _threads_from_argv(argv, default=1):
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return default


# BLAS thread pools are sized when torch loads its libraries, and
# torch.set_num_threads does not reach OpenBLAS's own pool: without these, a
# "one thread" run multiplies on every core.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(_threads_from_argv(sys.argv[1:]))

try:
    import torch  # noqa: E402
    import torch.nn as nn  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError as e:
    print(f"unavailable=no torch: {e}")
    sys.exit(3)

CONFIGS = {
    "A": dict(layers=4, d_model=256, heads=4, seq_len=128, batch=16),
    "B": dict(layers=8, d_model=512, heads=8, seq_len=256, batch=8),
    "124m": dict(layers=12, d_model=768, heads=12, seq_len=1024, batch=16, vocab=50257),
    "1.3b": dict(layers=24, d_model=2048, heads=16, seq_len=1024, batch=8, vocab=50257),
}


class Block(nn.Module):
    def __init__(self, d, n_head, sdpa=False):
        super().__init__()
        self.n_head = n_head
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)  # rows q|k|v
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, NH, T, HS)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, layers, d_model, heads, seq_len, vocab=256, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList([Block(d_model, heads, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


def peak_rss_kib():
    """This process's peak resident set (VmHWM), 0 where /proc is missing. Unlike
    getrusage's ru_maxrss it does not count the image the process was forked from."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# Shapes --mm times by default: a square reference and the forward product of
# config A's MLP, x(2048,256) . W(1024,256)^T.
MM_SHAPES = "2048x2048x2048:NN,2048x1024x256:NT"


def parse_mm_shapes(text):
    """ "MxNxK:OP,..." -> [(M, N, K, op)], op one of NN, NT, TN."""
    out = []
    for item in text.split(","):
        dims, _, op = item.partition(":")
        m, n, k = (int(x) for x in dims.split("x"))
        op = op or "NN"
        if op not in ("NN", "NT", "TN"):
            raise SystemExit(f"--mm-shapes: {item}: op must be NN, NT or TN")
        out.append((m, n, k, op))
    return out


def mm_rate(dtype, m, n, k, op, repeats, min_seconds):
    """GFLOP/s of torch.mm on one shape: a warm-up product, then `repeats` rounds of
    at least min_seconds of process CPU time (and one product) each; median and best."""
    a = torch.randn((k, m) if op == "TN" else (m, k)).to(dtype)
    b = torch.randn((n, k) if op == "NT" else (k, n)).to(dtype)

    def product():
        return torch.mm(a.t() if op == "TN" else a, b.t() if op == "NT" else b)

    product()
    rates = []
    for _ in range(repeats):
        c0, count = time.process_time(), 0
        while True:
            product()
            count += 1
            dt = time.process_time() - c0
            if dt >= min_seconds:
                break
        rates.append(2.0 * m * n * k * count / dt * 1e-9)
    return statistics.median(rates), max(rates)


def run_mm(args):
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} torch.mm, process CPU time")
    for m, n, k, op in parse_mm_shapes(args.mm_shapes):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            med, best = mm_rate(dtype, m, n, k, op, args.mm_repeats, 0.2)
            print(f"mm dtype={name} M={m} N={n} K={k} op={op} gflops={med:.2f} best={best:.2f}")
            sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), help="preset; explicit flags override it")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--autocast", choices=["bf16"], help="forward and loss under autocast in bf16")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--vocab", type=int, help="vocabulary size (default 256, or the preset's)")
    ap.add_argument("--sdpa", action="store_true", help="attention through F.scaled_dot_product_attention")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--mm", action="store_true", help="time torch.mm (fp32, bf16) instead of training")
    ap.add_argument("--mm-shapes", default=MM_SHAPES, help=f"MxNxK:OP,... (default {MM_SHAPES})")
    ap.add_argument("--mm-repeats", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.mm:
        run_mm(args)
        return

    cfg = dict(CONFIGS[args.config]) if args.config else dict(CONFIGS["A"])
    cfg.setdefault("vocab", 256)
    for key in ("layers", "d_model", "heads", "seq_len", "batch", "vocab"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("unavailable=torch sees no CUDA device")
        sys.exit(3)
    V = cfg["vocab"]
    model = GPT(cfg["layers"], cfg["d_model"], cfg["heads"], cfg["seq_len"], V, args.sdpa).to(dev)
    # The fused (one-kernel) AdamW on a GPU; the keyword is absent from older CPU builds of torch.
    fused = {"fused": True} if args.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **fused)
    n_params = sum(p.numel() for p in model.parameters())
    n_no_wpe = n_params - model.wpe.weight.numel()
    B, T = cfg["batch"], cfg["seq_len"]
    use_autocast = args.autocast == "bf16"
    forward = torch.compile(model) if args.compile else model

    def step():
        idx = torch.randint(0, V, (B, T + 1), device=dev)
        # Only forward and loss under autocast (PyTorch's recipe): backward runs each
        # op in the dtype its forward chose, and the gradients land in fp32 parameters.
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=use_autocast):
            loss = forward(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # troupe's default train.grad_clip (1.0), which the benchmark's job keeps.
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return loss.item()

    for _ in range(args.warmup):
        step()
    # Wall-clock and process CPU time per step. On a machine shared with other
    # work the CPU-time figure is what one uncontended thread would reach; on an
    # idle machine the two agree.
    wall, cpu = [], []
    for _ in range(args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    tps_wall = B * T / statistics.median(wall)
    tps_cpu = B * T / statistics.median(cpu)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} config={cfg} params={n_params} "
          f"autocast={args.autocast or 'off'} device={args.device} sdpa={args.sdpa} compile={args.compile}")
    print(f"steps={args.steps} median_step_ms wall={statistics.median(wall) * 1e3:.1f} "
          f"cpu={statistics.median(cpu) * 1e3:.1f}  tokens/s wall={tps_wall:.0f} cpu={tps_cpu:.0f} "
          f"last_loss={loss:.3f}")
    peak_dev = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    print(f"tokens_per_s={tps_wall:.1f} tokens_per_cpu_s={tps_cpu:.1f} params={n_params} "
          f"params_no_wpe={n_no_wpe} peak_rss_kib={peak_rss_kib()} last_loss={loss:.4f} "
          f"peak_device_bytes={peak_dev}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
