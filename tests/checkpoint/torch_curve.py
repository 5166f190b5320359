"""troupe's loss curve against PyTorch's, from the same initial weights on the same batches.

  torch_curve.py --troupe BIN --work DIR [--steps 20] [--precisions fp32,bf16]

Config A (GPT: 4 layers, d_model 256, 4 heads, seq_len 128, global batch 16, vocabulary the
256 bytes) is trained twice per precision, for --steps steps:

* troupe: `troupe run` of a spec with `model.init_from` a Hugging Face GPT-2 directory that
  this script writes (random weights from --seed: config.json + model.safetensors, Conv1D
  weights stored (in, out)) and `data.path` a text corpus that it writes from the fortunes
  (the first 64 KiB of the text files of /usr/share/games/fortunes, in sorted path order).
* PyTorch: the same GPT written with torch.nn.functional over the tensors read back from that
  model.safetensors, on the same corpus and the same batches (row i of step s is the window at
  ((s*B + i)*T) mod (len - T - 1), inputs its first T bytes, targets the next T), with
  torch.optim.AdamW (weight decay on the 2-D parameters only), torch.nn.utils.clip_grad_norm_
  and troupe's learning-rate schedule (linear warm-up, cosine decay to min_lr), on one thread.
  fp32 runs in fp32; bf16 runs the forward and the loss under
  torch.autocast("cpu", dtype=torch.bfloat16) with fp32 parameters, gradients and AdamW, the
  recipe troupe's train.precision: bf16 follows (docs/training.md, "Mixed precision").

It prints, per precision, a table of step, troupe's loss (metrics.jsonl), PyTorch's loss, their
relative difference and both gradient norms before clipping, the largest relative difference,
and how far 16 bits move each side's curve from its fp32 one. The losses must agree within
--tol-fp32 (fp32) or --tol-16 (bf16, fp16) at every step, and troupe's 16-bit curve must not be
its fp32 curve (train.precision took effect). fp16 runs PyTorch under
torch.autocast("cpu", dtype=torch.float16) with troupe's loss scaling; torch 1.13 has no CPU
autocast to float16, and there troupe's fp16 curve is compared with PyTorch's fp32 curve, and
the report says so. So is troupe's bf16 curve where this torch's CPU bf16 matrix product does
not accumulate in fp32 (measured on a small product before the run: torch 1.13 on a CPU without
bf16 instructions, AVX2 only, accumulates in bf16, 3.7e-2 off against 1.7e-3 for the rounding
of the output alone, which is not the recipe troupe follows), or where --torch-16 fp32 asks.

Exit status: 0 agree, 1 disagree or fail, 2 bad usage, 77 torch is not installed (a failure
in ctest: scripts/setup.sh --test installs it).
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
import warnings

# One compute thread for torch: its BLAS pools are sized when the libraries load.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # exit 77: see above
    print("torch is not installed (%s): skipped" % e)
    sys.exit(77)

FORTUNES = "/usr/share/games/fortunes"
CORPUS_BYTES = 64 * 1024

# Config A and the training recipe both sides run. At a peak learning rate of 1e-3 this model
# has one-step loss spikes (a gradient norm near 100 where the others are near 1) that magnify
# the rounding differences between the two sides some fortyfold; at 6e-4 the loss falls from
# 5.6 to 3.2 in 20 steps without one.
MODEL = dict(n_layers=4, d_model=256, n_heads=4, seq_len=128, vocab_size=256)
TRAIN = dict(global_batch=16, lr=6e-4, min_lr=6e-5, warmup_steps=5, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)
LN_EPS = 1e-5  # troupe's GPT LayerNorm (model/layers.hpp)


# ----------------------------------------------------------------------------- inputs

def write_corpus(path):
    """The first CORPUS_BYTES of the fortunes' text files (sorted paths; no links, no binary
    .dat indexes), written to path. Returns the bytes."""
    if not os.path.isdir(FORTUNES):
        raise SystemExit("%s is missing: install the fortunes package (scripts/setup.sh does)" % FORTUNES)
    data = bytearray()
    for name in sorted(os.listdir(FORTUNES)):
        p = os.path.join(FORTUNES, name)
        if os.path.islink(p) or not os.path.isfile(p) or name.endswith(".dat"):
            continue
        with open(p, "rb") as f:
            blob = f.read()
        if b"\0" in blob:
            continue
        data += blob
        if len(data) >= CORPUS_BYTES:
            break
    data = bytes(data[:CORPUS_BYTES])
    if len(data) < CORPUS_BYTES:
        raise SystemExit("%s holds %d bytes of text, the corpus needs %d" % (FORTUNES, len(data), CORPUS_BYTES))
    with open(path, "wb") as f:
        f.write(data)
    return data


def batch(data, step, B, T):
    """(inputs, targets), each (B, T) int64: troupe's rule (core/dataset.hpp) on the training
    split, here the whole corpus (data.val_fraction: 0)."""
    span = len(data) - T - 1
    rows_in, rows_out = [], []
    for i in range(B):
        start = ((step * B + i) % span) * T % span
        rows_in.append(list(data[start:start + T]))
        rows_out.append(list(data[start + 1:start + T + 1]))
    return torch.tensor(rows_in, dtype=torch.long), torch.tensor(rows_out, dtype=torch.long)


def lr_at(step, steps):
    """parallel/optimizer.cpp lr_at: linear warm-up to lr, then cosine decay to min_lr."""
    lr, warm, min_lr = TRAIN["lr"], TRAIN["warmup_steps"], TRAIN["min_lr"]
    if step < warm:
        return lr * (step + 1) / warm
    decay = steps - warm
    if decay <= 0:
        return lr
    progress = min(1.0, max(0.0, (step - warm) / decay))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------- weights

def initial_weights(seed):
    """troupe's parameter names and shapes (Linear weights (out, in)): GPT-2's initialisation
    (N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))) with LayerNorm weights and every
    bias perturbed too, so that a parameter read in the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    L, D, T, V = MODEL["n_layers"], MODEL["d_model"], MODEL["seq_len"], MODEL["vocab_size"]

    def normal(std, *shape):
        return torch.randn(*shape, generator=g) * std

    proj = 0.02 / math.sqrt(2 * L)
    w = {"wte.weight": normal(0.02, V, D), "wpe.weight": normal(0.02, T, D)}
    for layer in range(L):
        h = "h.%d." % layer
        for ln in ("ln_1", "ln_2"):
            w[h + ln + ".weight"] = 1.0 + normal(0.1, D)
            w[h + ln + ".bias"] = normal(0.02, D)
        for name, n_out, n_in, std in (("attn.c_attn", 3 * D, D, 0.02), ("attn.c_proj", D, D, proj),
                                       ("mlp.c_fc", 4 * D, D, 0.02), ("mlp.c_proj", D, 4 * D, proj)):
            w[h + name + ".weight"] = normal(std, n_out, n_in)
            w[h + name + ".bias"] = normal(0.02, n_out)
    w["ln_f.weight"] = 1.0 + normal(0.1, D)
    w["ln_f.bias"] = normal(0.02, D)
    return w


def is_conv1d(name):
    """GPT-2 stores these (in, out) (Conv1D); troupe and torch.nn.Linear (out, in)."""
    return name.endswith(".weight") and any(p in name for p in (".c_attn.", ".c_proj.", ".c_fc."))


def write_safetensors(path, tensors):
    """name -> f32 tensor, little-endian, in the safetensors layout: u64 header length, JSON
    header (padded with spaces to 8 bytes), the data in header order."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """name -> f32 tensor of an F32 safetensors file (as write_safetensors writes them)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit("%s: %s is %s, expected F32" % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        raw = bytearray(blob[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(info["shape"]).clone()
    return out


def write_hf_dir(d, weights):
    """A Hugging Face GPT2LMHeadModel directory of `weights` (troupe's names): what
    model.init_from reads (docs/checkpoints.md, "Hugging Face format")."""
    os.makedirs(d)
    tensors = {"transformer." + k: (v.t() if is_conv1d(k) else v) for k, v in weights.items()}
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": MODEL["vocab_size"],
              "n_embd": MODEL["d_model"], "n_layer": MODEL["n_layers"], "n_head": MODEL["n_heads"],
              "n_positions": MODEL["seq_len"], "n_ctx": MODEL["seq_len"], "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": LN_EPS, "tie_word_embeddings": True,
              "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
              "reorder_and_upcast_attn": False, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def read_hf_dir(d):
    """troupe's names and layouts of the tensors in d/model.safetensors."""
    out = {}
    for k, v in read_safetensors(os.path.join(d, "model.safetensors")).items():
        name = k[len("transformer."):]
        out[name] = v.t().contiguous() if is_conv1d(name) else v
    return out


# ----------------------------------------------------------------------------- PyTorch

def gpt_loss(p, idx, targets):
    """Mean cross-entropy over the B*T tokens of troupe's GPT (docs/training.md, "What is
    trained"): learned positions, pre-LayerNorm blocks, causal attention scaled by
    1/sqrt(head size), GELU (tanh) MLP, the LM head tied to wte."""
    B, T = idx.shape
    D, NH, V = MODEL["d_model"], MODEL["n_heads"], MODEL["vocab_size"]
    HS = D // NH
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def ln(x, name):
        return F.layer_norm(x, (D,), p[name + ".weight"], p[name + ".bias"], LN_EPS)

    def linear(x, name):
        return F.linear(x, p[name + ".weight"], p[name + ".bias"])

    x = F.embedding(idx, p["wte.weight"]) + p["wpe.weight"][:T]
    for layer in range(MODEL["n_layers"]):
        h = "h.%d." % layer
        q, k, v = linear(ln(x, h + "ln_1"), h + "attn.c_attn").split(D, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, D)
        x = x + linear(y, h + "attn.c_proj")
        m = F.gelu(linear(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + linear(m, h + "mlp.c_proj")
    logits = F.linear(ln(x, "ln_f"), p["wte.weight"])
    return F.cross_entropy(logits.view(B * T, V), targets.reshape(B * T))


def autocast_dtype(precision):
    """The torch dtype torch.autocast("cpu") runs `precision` in, None for fp32; raises
    RuntimeError where this torch's CPU autocast does not take it, or does not follow the
    mixed-precision recipe (16-bit operands, products accumulated in fp32)."""
    if precision == "fp32":
        return None
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 1.13 warns before it raises for float16
        with torch.autocast("cpu", dtype=dt):
            if F.linear(torch.ones(1, 2), torch.ones(3, 2)).dtype != dt:
                raise RuntimeError("torch.autocast('cpu', dtype=%s) leaves products in float32" % dt)
        # The product of 16-bit operands against the same operands' product accumulated in
        # fp32: rounding the output to 16 bits alone is ~2e-3 off (bf16); accumulating in 16 bits
        # is an order of magnitude more.
        g = torch.Generator().manual_seed(0)
        a = torch.randn(64, 512, generator=g).to(dt)
        b = torch.randn(512, 64, generator=g).to(dt)
        exact = a.float() @ b.float()
        err = float((torch.matmul(a, b).float() - exact).norm() / exact.norm())
        if err > 1e-2:
            raise RuntimeError("this torch's CPU %s matrix product does not accumulate in float32 on this CPU "
                               "(relative error %.1e against the fp32 product of the same operands)" % (dt, err))
    return dt


def torch_curve(weights, data, steps, precision):
    """Per step: (loss before the update, gradient norm before clipping or None for a skipped
    step). fp16 scales the loss as troupe does (torch.cuda.amp.GradScaler's rule: 2^16 at
    first, halved and the step skipped on an inf or NaN gradient, doubled after 2000 clean
    steps); a skipped step is not counted by AdamW, since opt.step() does not run."""
    dt = autocast_dtype(precision)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in weights.items()}
    # troupe decays 2-D parameters (embeddings and Linear weights), not biases or LayerNorms.
    decay = [v for v in params.values() if v.dim() == 2]
    rest = [v for v in params.values() if v.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=TRAIN["lr"],
                            betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"])
    B, T = TRAIN["global_batch"], MODEL["seq_len"]
    scale, clean = (2.0 ** 16 if precision == "fp16" else 1.0), 0
    out = []
    for s in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(s, steps)
        idx, targets = batch(data, s, B, T)
        opt.zero_grad(set_to_none=True)
        if dt is None:
            loss = gpt_loss(params, idx, targets)
        else:
            with torch.autocast("cpu", dtype=dt):
                loss = gpt_loss(params, idx, targets)
        (loss * scale if scale != 1.0 else loss).backward()
        if scale != 1.0:
            grads = [p.grad for p in params.values() if p.grad is not None]
            if not all(torch.isfinite(g).all() for g in grads):
                out.append((loss.item(), None))
                scale, clean = scale / 2, 0
                continue
            for g in grads:
                g.div_(scale)
            clean += 1
            if clean == 2000:
                scale, clean = scale * 2, 0
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), TRAIN["grad_clip"])
        opt.step()
        out.append((loss.item(), norm.item()))
    return out


# ----------------------------------------------------------------------------- troupe

def spec_text(name, hf_dir, corpus, steps, precision, seed):
    m, t = MODEL, TRAIN
    return "\n".join([
        "name: %s" % name,
        "model: {type: gpt, vocab_size: %d, seq_len: %d, d_model: %d, n_layers: %d, n_heads: %d, init_from: %s}"
        % (m["vocab_size"], m["seq_len"], m["d_model"], m["n_layers"], m["n_heads"], json.dumps(hf_dir)),
        "data: {source: text, path: %s, val_fraction: 0}" % json.dumps(corpus),
        "train:",
        "  steps: %d" % steps,
        "  global_batch: %d" % t["global_batch"],
        "  micro_batch: %d" % t["global_batch"],
        "  seed: %d" % seed,
        "  precision: %s" % precision,
        "  lr_schedule: cosine",
        "  warmup_steps: %d" % t["warmup_steps"],
        "  min_lr: %r" % t["min_lr"],
        "  grad_clip: %r" % t["grad_clip"],
        "  eval_every: 0",
        "  optimizer: {type: adamw, lr: %r, beta1: %r, beta2: %r, eps: %r, weight_decay: %r}"
        % (t["lr"], t["beta1"], t["beta2"], t["eps"], t["weight_decay"]),
        "resources: {threads_per_worker: 1}",
        ""])


def start_troupe(args, precision, hf_dir, corpus):
    """Starts `troupe run` of config A in `precision`; returns (process, runs dir, log path)."""
    d = os.path.join(args.work, precision)
    os.makedirs(d)
    spec = os.path.join(d, "spec.yaml")
    with open(spec, "w") as f:
        f.write(spec_text("torch_curve_" + precision, hf_dir, corpus, args.steps, precision, args.seed))
    runs, log = os.path.join(d, "runs"), os.path.join(d, "troupe.log")
    cmd = [args.troupe, "run", spec, "-q", "--runs-dir", runs]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    return proc, runs, log, cmd


def finish_troupe(proc, runs, log, cmd, steps):
    """Waits for the run; its per-step (loss, grad_norm) from metrics.jsonl."""
    rc = proc.wait()
    with open(log) as f:
        text = f.read()
    if rc != 0:
        print(text, end="")
        raise SystemExit("troupe failed (exit %d): %s" % (rc, " ".join(cmd)))
    found = [os.path.join(runs, r) for r in sorted(os.listdir(runs))]
    if len(found) != 1:
        raise SystemExit("expected one run directory under %s, found %s" % (runs, found))
    rows = {}
    with open(os.path.join(found[0], "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            rows[m["step"]] = (m["loss"], m["grad_norm"])
    # The checkpoint written at the end of the job is not needed: 40 MB a run.
    shutil.rmtree(os.path.join(found[0], "ckpt"), ignore_errors=True)
    if sorted(rows) != list(range(steps)):
        raise SystemExit("%s: metrics.jsonl has steps %s, expected 0..%d" % (found[0], sorted(rows), steps - 1))
    return [rows[s] for s in range(steps)]


# ----------------------------------------------------------------------------- report

def fmt_norm(g):
    return "%10.5f" % g if g is not None else "%10s" % "skipped"


def max_rel(a, b):
    """The largest |a - b| / |b| over the steps of two curves of (loss, norm)."""
    return max(abs(x[0] - y[0]) / abs(y[0]) for x, y in zip(a, b))


def report(title, ours, theirs, tol):
    print("\n%s (tolerance %.1e relative per step)" % (title, tol))
    print("%4s  %12s  %12s  %9s  %10s  %10s" % ("step", "troupe loss", "torch loss", "rel diff", "troupe |g|",
                                                 "torch |g|"))
    for s, ((lt, gt), (lp, gp)) in enumerate(zip(ours, theirs)):
        print("%4d  %12.7f  %12.7f  %9.2e  %s  %s" % (s, lt, lp, abs(lt - lp) / abs(lp), fmt_norm(gt),
                                                      fmt_norm(gp)))
    worst = max_rel(ours, theirs)
    print("max relative difference %.2e over %d steps: %s" % (worst, len(ours),
                                                            "agree" if worst <= tol else "DISAGREE"))
    return worst


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", required=True, help="the troupe binary")
    ap.add_argument("--work", required=True, help="a scratch directory (emptied first)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--seed", type=int, default=1, help="of the initial weights")
    ap.add_argument("--tol-fp32", type=float, default=1e-5, help="largest relative loss difference in fp32")
    ap.add_argument("--tol-16", type=float, default=2e-2, help="largest relative loss difference in bf16, fp16")
    ap.add_argument("--torch-16", choices=("auto", "fp32"), default="auto",
                    help="what troupe's 16-bit curves are compared with: torch.autocast where this torch's "
                         "follows the recipe (auto), or PyTorch's fp32 curve (fp32: the fallback, forced)")
    args = ap.parse_args()
    precisions = [p for p in args.precisions.split(",") if p]
    bad = [p for p in precisions if p not in ("fp32", "bf16", "fp16")]
    if bad or not precisions or len(set(precisions)) != len(precisions):
        ap.error("--precisions: give each of fp32, bf16, fp16 at most once, got '%s'" % args.precisions)
    if args.steps < TRAIN["warmup_steps"] or args.steps > 1000:
        ap.error("--steps must be in [%d, 1000] (the warm-up takes %d), got %d" % (
            TRAIN["warmup_steps"], TRAIN["warmup_steps"], args.steps))
    if not (os.path.isfile(args.troupe) and os.access(args.troupe, os.X_OK)):
        ap.error("--troupe %s is not an executable file" % args.troupe)
    torch.set_num_threads(1)
    print("CPU: %s; torch %s, %d thread" % (cpu_model(), torch.__version__, torch.get_num_threads()))

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    corpus = os.path.join(args.work, "corpus.txt")
    data = write_corpus(corpus)
    hf_dir = os.path.join(args.work, "hf")
    write_hf_dir(hf_dir, initial_weights(args.seed))
    weights = read_hf_dir(hf_dir)  # PyTorch starts from the bytes troupe reads

    ours, theirs, failed, summary = {}, {}, [], []
    for precision in precisions:
        # torch's side: autocast to `precision`, or where this torch has none (float16 on the
        # CPU before torch 2), fp32 and the comparison says so.
        against = precision
        try:
            if precision != "fp32" and args.torch_16 == "fp32":
                raise RuntimeError("--torch-16 fp32")
            autocast_dtype(precision)
        except RuntimeError as e:
            print("\n%s: this torch (%s) has no CPU autocast to %s that follows the recipe (%s): troupe's %s "
                  "curve is compared with PyTorch's fp32 curve instead" % (precision, torch.__version__, precision,
                                                                          str(e).strip().splitlines()[0], precision))
            against = "fp32"
        t0 = time.time()
        run = start_troupe(args, precision, hf_dir, corpus)  # one worker thread beside torch's one
        try:
            if against not in theirs:
                theirs[against] = torch_curve(weights, data, args.steps, against)
        except BaseException:
            run[0].kill()
            run[0].wait()
            raise
        ours[precision] = finish_troupe(*run, args.steps)
        tol = args.tol_fp32 if precision == "fp32" else args.tol_16
        how = {"fp32": "fp32", "bf16": "torch.autocast('cpu', dtype=torch.bfloat16)",
               "fp16": "torch.autocast('cpu', dtype=torch.float16)"}[against]
        worst = report("%s: troupe train.precision %s vs PyTorch %s" % (precision, precision, how), ours[precision],
                       theirs[against], tol)
        print("(%.1f s)" % (time.time() - t0))
        summary.append("%s vs torch %s: max rel diff %.2e (tolerance %.1e)" % (precision, against, worst, tol))
        if worst > tol:
            failed.append(precision)
    # How far 16 bits move each side's curve from its fp32 one: the scale the 16-bit
    # comparison works at, and a check that train.precision took effect in troupe.
    for precision in ("bf16", "fp16"):
        if precision in ours and "fp32" in ours:
            gap = max_rel(ours[precision], ours["fp32"])
            line = "%s vs fp32 within troupe: max rel diff %.2e" % (precision, gap)
            if precision in theirs:
                line += "; within PyTorch: %.2e" % max_rel(theirs[precision], theirs["fp32"])
            summary.append(line)
            if gap == 0.0:
                summary.append("troupe's %s curve is its fp32 curve bit for bit: train.precision had no effect"
                               % precision)
                failed.append(precision)
    print("\nsummary:\n  " + "\n  ".join(summary))
    if failed:
        print("FAILED: %s" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
