#!/usr/bin/env python3
"""PyTorch reference for troupe's training throughput.

The same byte-level GPT as model/ (vocab 256, learned positions, pre-LayerNorm,
GELU-tanh MLP, LM head tied to wte), trained with AdamW on random tokens, on one
CPU thread unless told otherwise. Prints tokens/s after warm-up; the last line
is machine-readable for bench/train_throughput:

    tokens_per_s=<median-step figure> params=<count> params_no_wpe=<count>

Configurations used in the reports:
    A: --layers 4 --d-model 256 --heads 4 --seq-len 128 --batch 16   (or --config A)
    B: --layers 8 --d-model 512 --heads 8 --seq-len 256 --batch 8    (or --config B)
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

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CONFIGS = {
    "A": dict(layers=4, d_model=256, heads=4, seq_len=128, batch=16),
    "B": dict(layers=8, d_model=512, heads=8, seq_len=256, batch=8),
}


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
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
    def __init__(self, layers, d_model, heads, seq_len, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
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
    args = ap.parse_args()

    cfg = dict(CONFIGS[args.config]) if args.config else dict(CONFIGS["A"])
    for key in ("layers", "d_model", "heads", "seq_len", "batch"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT(cfg["layers"], cfg["d_model"], cfg["heads"], cfg["seq_len"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    n_params = sum(p.numel() for p in model.parameters())
    n_no_wpe = n_params - model.wpe.weight.numel()
    B, T = cfg["batch"], cfg["seq_len"]

    def step():
        idx = torch.randint(0, 256, (B, T + 1))
        loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # troupe's default train.grad_clip (1.0), which the benchmark's job keeps.
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
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
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} config={cfg} params={n_params}")
    print(f"steps={args.steps} median_step_ms wall={statistics.median(wall) * 1e3:.1f} "
          f"cpu={statistics.median(cpu) * 1e3:.1f}  tokens/s wall={tps_wall:.0f} cpu={tps_cpu:.0f} "
          f"last_loss={loss:.3f}")
    print(f"tokens_per_s={tps_wall:.1f} tokens_per_cpu_s={tps_cpu:.1f} params={n_params} "
          f"params_no_wpe={n_no_wpe}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
