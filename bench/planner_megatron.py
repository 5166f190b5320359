#!/usr/bin/env python3
"""The planner's cost model at cluster scale: Megatron-LM's published runs against `troupe plan`.

Each row is a large GPT training run on A100 80 GB GPUs (DGX A100 / Selene nodes: 8 GPUs on
NVLink 3, one 200 Gb/s HDR InfiniBand NIC per GPU) whose paper gives the model, the layout and
the measured time of an iteration. The row's spec fixes what the paper fixes; `troupe plan
--json --hardware a100-80gb --attention materialized` prices it (a GPU job is priced as
Megatron-LM runs it: plan/cost_model.hpp), and the table shows predicted against published
seconds per iteration.

These runs computed attention unfused: the whole s x s square of scores, masked, soft-maxed
and kept for the backward (Korthikanti et al.'s 5 a s^2 b bytes per layer; their selective
recomputation recomputes exactly that part). So they are priced with `--attention
materialized`, the kernel they ran; `--attention fused` prices them as troupe would run them
(a flash-style kernel: no s x s term, selective recomputation the same as none), which shows
how much of their time and memory attention took.

  bench/planner_megatron.py [--build build] [--hardware a100-80gb] [--attention materialized|fused] [--json]

Sources (facts and figures, quoted in docs/planner.md):
  K22  Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
       arXiv 2205.05198: table 3 (configurations: sequence 2048, vocabulary 51200, no data
       parallelism, the interleaved schedule with 3 chunks for 175B and 530B) and table 5
       (iteration time with full recomputation, and with selective recomputation + sequence
       parallelism); section 6: the 530B model on 2240 GPUs (data 8) at 39.15 s.
  MLM  NVIDIA/Megatron-LM README (2022): GPT-3 175B on 1024 A100s, global batch 1536, "each
       iteration takes around 32 seconds"; its examples/pretrain_gpt3_175B.sh: tensor 8,
       pipeline 16, micro-batch 1, uniform (full) activation recomputation, no interleaving.
  N21  Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
       Megatron-LM", SC21, table 1 (weak scaling, full recomputation, the interleaved schedule):
       measured teraFLOP/s per GPU, turned into seconds per iteration with the paper's own
       FLOP count 96 B s l h^2 (1 + s/6h + V/16lh) over GPUs x teraFLOP/s. The paper gives no
       micro-batch size or chunk count per row: the planner chooses both (micro_batch and
       virtual_stages auto), so these rows are the model's best case for the published layout.
  BLOOM  BigScience's BLOOM-176B (Megatron-DeepSpeed): bigscience-workshop/bigscience
       train/tr11-176B-ml/README.md (hidden 14336, 70 layers, 112 heads, vocabulary 250880,
       sequence 2048, tensor 4, pipeline 12, data 8, micro-batch 2, bf16, its ZeRO-1 optimizer,
       activation checkpointing) and the BigScience page: "one copy of the model takes 48 GPUs
       (using 60 GB of memory on each GPU)". The one per-GPU memory figure of these runs given
       as text; its interconnect (Omni-Path) is not the profile's, so only its memory is compared.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

V, S = 51200, 2048

# name, source, heads, hidden, layers, tensor, pipeline, gpus, batch, micro, recompute, seq parallel,
# virtual stages (None: not interleaved, "auto": planner), published seconds per iteration
ROWS = [
    ("22B full", "K22 t5", 64, 6144, 48, 8, 1, 8, 4, 4, "full", False, None, 1.42),
    ("22B sel+SP", "K22 t5", 64, 6144, 48, 8, 1, 8, 4, 4, "selective", True, None, 1.10),
    ("175B full", "K22 t5", 96, 12288, 96, 8, 8, 64, 64, 1, "full", False, 3, 18.13),
    ("175B sel+SP", "K22 t5", 96, 12288, 96, 8, 8, 64, 64, 1, "selective", True, 3, 13.75),
    ("530B full", "K22 t5", 128, 20480, 105, 8, 35, 280, 280, 1, "full", False, 3, 49.05),
    ("530B sel+SP", "K22 t5", 128, 20480, 105, 8, 35, 280, 280, 1, "selective", True, 3, 37.83),
    ("1T full", "K22 t5", 160, 25600, 128, 8, 64, 512, 512, 1, "full", False, None, 94.42),
    ("1T sel+SP", "K22 t5", 160, 25600, 128, 8, 64, 512, 512, 1, "selective", True, None, 71.49),
    ("530B sel+SP dp8", "K22 s6", 128, 20480, 105, 8, 35, 2240, 2240, 1, "selective", True, 3, 39.15),
    ("GPT-3 175B 1024", "MLM", 96, 12288, 96, 8, 16, 1024, 1536, 1, "full", False, None, 32.0),
]

# N21 table 1: params (B), heads, hidden, layers, tensor, pipeline, GPUs, batch, TFLOP/s per GPU
N21 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
for p, a, h, l, t, pp, n, b, tf in N21:
    flops = 96 * b * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))
    ROWS.append((f"{p:g}B", "N21 t1", a, h, l, t, pp, n, b, "auto", "full", False,
                 "auto" if pp > 1 else None, flops / (n * tf * 1e12)))


def spec(name, a, h, l, t, pp, n, b, mb, rc, sp, v):
    sched = "interleaved" if v else "1f1b"
    vs = f", virtual_stages: {v}" if v else ""
    return (
        f"name: {name.replace(' ', '-').replace('+', '')}\n"
        f"model: {{type: gpt, vocab_size: {V}, seq_len: {S}, d_model: {h}, n_layers: {l}, n_heads: {a}}}\n"
        "data: {source: tokens, path: /nonexistent.bin}\n"
        f"train: {{steps: 10, global_batch: {b}, micro_batch: {mb}, recompute: {rc}, precision: bf16}}\n"
        f"parallel: {{data: {n // (t * pp)}, pipeline: {pp}, tensor: {t}, schedule: {sched}{vs}, "
        f"sequence_parallel: {'true' if sp else 'false'}}}\n"
        "resources: {device: cuda}\n"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--hardware", default="a100-80gb")
    ap.add_argument("--attention", default="materialized", choices=["materialized", "fused"],
                    help="how attention is priced (default: as these runs computed it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    troupe = os.path.abspath(os.path.join(a.build, "troupe"))
    work = tempfile.mkdtemp(prefix="troupe-planner-megatron-")
    out = []
    print(f"{'run':18s} {'source':7s} {'layout':>10s} {'v':>4s} {'mb':>3s} {'recompute':9s} {'GPUs':>5s} "
          f"{'published s':>11s} {'predicted s':>11s} {'error':>7s} {'GiB/GPU':>8s} {'bubble':>6s}")
    for name, src, heads, h, l, t, pp, n, b, mb, rc, sp, v, published in ROWS:
        path = os.path.join(work, name.replace(" ", "_").replace("+", "") + ".yaml")
        with open(path, "w") as f:
            f.write(spec(name, heads, h, l, t, pp, n, b, mb, rc, sp, v))
        r = subprocess.run([troupe, "plan", path, "--json", "--hardware", a.hardware, "--devices", str(n),
                            "--attention", a.attention], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: troupe plan failed: {r.stderr.strip()}", file=sys.stderr)
            return 1
        c = json.loads(r.stdout)["chosen"]
        err = c["step_time_s"] / published - 1
        out.append({"run": name, "source": src, "published_s": published, "predicted_s": c["step_time_s"],
                    "error": err, "plan": c})
        print(f"{name:18s} {src:7s} {n // (t * pp):>3d}x{pp}x{t:<4d} {c['virtual_stages']:4d} {c['micro_batch']:3d} "
              f"{rc:9s} {n:5d} {published:11.2f} {c['step_time_s']:11.2f} {100 * err:+6.1f}% "
              f"{c['memory_bytes']['total'] / 2**30:8.1f} {100 * c['bubble_fraction']:5.1f}%")
    print()
    # The a100-80gb profile's GEMM efficiency was fitted on K22's full-recomputation runs; the
    # others validate the model.
    calibration = [x for x in out if x["source"] == "K22 t5" and x["run"].endswith("full")]
    validation = [x for x in out if x not in calibration]
    for label, sel in [("calibration (K22 full recompute: the profile's GEMM efficiency was fitted on these)", calibration),
                       ("validation (the other runs)", validation),
                       ("  of which K22 + MLM (published configurations)", [x for x in validation if x["source"] != "N21 t1"]),
                       ("  of which N21 (micro-batch and chunks chosen by the planner)", [x for x in validation if x["source"] == "N21 t1"]),
                       ("all", out)]:
        errs = [abs(x["error"]) for x in sel]
        print(f"{label}: {len(sel)} runs, mean |error| {100 * statistics.mean(errs):.1f}%, "
              f"max {100 * max(errs):.1f}%, mean error {100 * statistics.mean(x['error'] for x in sel):+.1f}%")
    # Memory: BLOOM-176B's "60 GB of memory on each GPU".
    bloom = ("name: bloom\n"
             "model: {type: gpt, vocab_size: 250880, seq_len: 2048, d_model: 14336, n_layers: 70, n_heads: 112}\n"
             "data: {source: tokens, path: /nonexistent.bin}\n"
             "train: {steps: 10, global_batch: 2048, micro_batch: 2, recompute: full, precision: bf16, zero: 1}\n"
             "parallel: {data: 8, pipeline: 12, tensor: 4, schedule: 1f1b}\n"
             "resources: {device: cuda}\n")
    path = os.path.join(work, "bloom.yaml")
    with open(path, "w") as f:
        f.write(bloom)
    r = subprocess.run([troupe, "plan", path, "--json", "--hardware", a.hardware, "--attention", a.attention],
                       capture_output=True, text=True)
    if r.returncode == 0:
        c = json.loads(r.stdout)["chosen"]
        m = c["memory_bytes"]
        gb = m["total"] / 1e9
        print(f"\nmemory: BLOOM-176B 8x12x4 mb2 full, ZeRO 1: published about 60 GB per GPU, predicted {gb:.1f} GB "
              f"({100 * (gb / 60 - 1):+.0f}%): params {m['params'] / 1e9:.1f}, grads {m['grads'] / 1e9:.1f}, "
              f"optimizer {m['optimizer'] / 1e9:.1f}, activations {m['activations'] / 1e9:.1f}, "
              f"other {m['other'] / 1e9:.1f} GB (pipeline rank {c['memory_pipeline_rank']})")
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
