"""PyTorch's causal attention on one thread, for bench/attention_bench.cpp.

    attention_reference.py T HEADS HS f32|bf16

Prints "fwd_ms=... fwdbwd_ms=... attn_kib=... impl=..." (medians of up to 5 runs after a
warm-up, in process CPU time on one thread; attn_kib: peak resident set minus the resident set before the tensors existed), or
"unavailable=<why>" and exits 3. impl is "sdpa" (torch.nn.functional.scaled_dot_product_attention,
torch 2.0 and later) or "eager" (softmax(q k^T / sqrt(HS) + causal mask) v, on older torch).
"""
import sys
import time


def rss_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    T, H, HS, prec = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    try:
        import torch
    except ImportError as e:
        print("unavailable=no torch (%s)" % e)
        return 3
    torch.set_num_threads(1)
    base = rss_kib("VmRSS")
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, H, T, HS, generator=g, dtype=torch.float32).mul(2).sub(1).to(dt).requires_grad_()
               for _ in range(3))
    dout = torch.rand(1, H, T, HS, generator=g).mul(2).sub(1).to(dt)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    mask = None if sdpa is not None else torch.ones(T, T, dtype=torch.bool).triu(1)

    def forward():
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=True)
        s = (q @ k.transpose(-1, -2)) / HS ** 0.5
        return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v

    fwd, fb = [], []
    for r in range(6):
        t0 = time.process_time()
        out = forward()
        t1 = time.process_time()
        out.backward(dout)
        t2 = time.process_time()
        q.grad = k.grad = v.grad = None
        if r > 0:
            fwd.append(t1 - t0)
            fb.append(t2 - t0)
        if r >= 2 and sum(fb) > 10:
            break
    fwd.sort()
    fb.sort()
    print("fwd_ms=%.3f fwdbwd_ms=%.3f attn_kib=%d impl=%s" % (
        fwd[len(fwd) // 2] * 1e3, fb[len(fb) // 2] * 1e3, rss_kib("VmHWM") - base,
        "sdpa" if sdpa is not None else "eager-torch-" + torch.__version__.split("+")[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
