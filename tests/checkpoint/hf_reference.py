"""Reference forwards of Hugging Face's GPT2LMHeadModel and LlamaForCausalLM in plain torch
(no transformers package), over the tensor names and config.json keys of a Hugging Face
directory, to check troupe's export and forward against.

  hf_reference.py pipeline --troupe BIN --dump-logits BIN --spec SPEC --work DIR
      trains SPEC for its steps (`troupe run`), exports the checkpoint with
      `troupe ckpt export --format hf`, runs dump_logits on a token sequence of seq_len
      tokens and compares troupe's logits with the forward below (max abs within --tol).
      With --reimport, troupe also reads the export back (dump_logits --hf, as model.init_from
      reads a Hugging Face directory) and those logits are compared too.
  hf_reference.py finetune --troupe BIN --dump-logits BIN --tokenizer-dir DIR --corpus PATH --work DIR
      the fine-tuning path of docs/training.md: a random Llama 3.2-shaped model written in
      Hugging Face's format with the vocabulary of the tokenizer in DIR (llama3 rope scaling, tied
      embeddings); troupe reads it (its logits against this forward); `troupe data tokenize` of
      the corpus with that tokenizer; `troupe run` with model.init_from the directory;
      `troupe sample` decoding with the tokenizer; the export compared with this forward.
  hf_reference.py compare HF_DIR LOGITS TOKEN...
      the comparison alone: LOGITS is a (T, V) little-endian f32 file.
  hf_reference.py self-test
      checks the forwards on random tensors: shapes, causality, grouped-query heads,
      the rotary convention, tied and untied heads.

The forward is picked by config.json's model_type (FORWARDS); a model is one function of
(cfg, tensors, tokens) -> logits (T, V). The reference computes in float64.
Exit status: 0 agree, 1 disagree or fail, 77 torch is not installed (a failure in ctest: scripts/setup.sh --test installs it).
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

try:
    import torch
except ImportError as e:  # ctest SKIP_RETURN_CODE
    print("torch is not installed (%s): skipped" % e)
    sys.exit(77)

torch.set_default_dtype(torch.float64)


# ----------------------------------------------------------------------------- files

def read_safetensors(path):
    """name -> float64 tensor, parsed by hand: u64 header length, JSON header, raw data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = bytearray(blob[base + begin:base + end])
        dtype = info["dtype"]
        if dtype == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32)
        elif dtype == "F64":
            t = torch.frombuffer(raw, dtype=torch.float64)
        elif dtype == "F16":
            t = torch.frombuffer(raw, dtype=torch.float16)
        elif dtype == "BF16":  # the top half of an f32
            bits = torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) << 16
            t = bits.view(torch.float32)
        else:
            continue  # integer buffers are not weights
        out[name] = t.to(torch.float64).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    """name -> tensor, written as F32 (the format read_safetensors reads)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_hf_dir(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return cfg, read_safetensors(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(d, name)))
    return cfg, tensors


# ----------------------------------------------------------------------------- pieces

def causal_attention(q, k, v):
    """q, k, v (NH, T, HS) -> (T, NH*HS): softmax(q k^T / sqrt(HS), causal) v."""
    nh, t, hs = q.shape
    scores = q @ k.transpose(1, 2) / math.sqrt(hs)
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, nh * hs)


def heads(x, n):
    """(T, n*HS) -> (n, T, HS)."""
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(0, 1)


def gelu_new(x):
    """GPT-2's GELU, the tanh approximation."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_inv_freq(hs, theta, rope_scaling=None):
    """(HS/2,) inverse frequencies as Hugging Face's LlamaRotaryEmbedding forms them, in float32:
    _compute_default_rope_parameters, then for rope_type "llama3" _compute_llama3_parameters
    (Llama 3.1: low frequencies slowed by `factor`, high ones kept, a blend between)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).to(dtype=torch.float32) / hs))
    if not rope_scaling:
        return inv_freq.to(torch.float64)
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    assert kind == "llama3", "rope_scaling %r" % rope_scaling
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama.to(torch.float64)


def rope_cos_sin(t, hs, theta, rope_scaling=None):
    """cos, sin (T, HS): position p, pair (i, i + HS/2) turned by p * inv_freq[i]
    (theta^(-2i/HS), llama3-scaled when rope_scaling says so)."""
    inv_freq = rope_inv_freq(hs, theta, rope_scaling)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x (n, T, HS): Hugging Face's convention, x*cos + rotate_half(x)*sin."""
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------- models

def gpt2_forward(cfg, t, tokens):
    """GPT2LMHeadModel: Conv1D weights are (in, out); the LM head is wte."""
    p = "transformer." if "transformer.wte.weight" in t else ""
    nh = cfg.get("n_head", 12)
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    d = cfg.get("n_embd", 768)
    assert cfg.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh")
    ids = torch.tensor(tokens, dtype=torch.long)
    n = len(tokens)

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (d,), t[name + ".weight"], t[name + ".bias"], eps)

    def conv1d(x, name):
        return x @ t[name + ".weight"] + t[name + ".bias"]

    x = t[p + "wte.weight"][ids] + t[p + "wpe.weight"][:n]
    for layer in range(cfg.get("n_layer", 12)):
        h = "%sh.%d." % (p, layer)
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(d, dim=-1)
        x = x + conv1d(causal_attention(heads(q, nh), heads(k, nh), heads(v, nh)), h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    return ln(x, p + "ln_f") @ t[p + "wte.weight"].T


def llama_forward(cfg, t, tokens):
    """LlamaForCausalLM: RMSNorm, rotary q/k (rotate_half), grouped-query attention (query head
    h reads kv head h // (NH/NKV)), down(silu(gate(x)) * up(x)); nn.Linear weights (out, in)."""
    d = cfg.get("hidden_size", 4096)
    nh = cfg.get("num_attention_heads", 32)
    nkv = cfg.get("num_key_value_heads") or nh
    hs = cfg.get("head_dim") or d // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    assert cfg.get("hidden_act", "silu") == "silu"
    ids = torch.tensor(tokens, dtype=torch.long)
    cos, sin = rope_cos_sin(len(tokens), hs, cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling"))

    def linear(x, name):
        return x @ t[name + ".weight"].T

    x = t["model.embed_tokens.weight"][ids]
    for layer in range(cfg.get("num_hidden_layers", 32)):
        h = "model.layers.%d." % layer
        a = rms_norm(x, t[h + "input_layernorm.weight"], eps)
        q = apply_rope(heads(linear(a, h + "self_attn.q_proj"), nh), cos, sin)
        k = apply_rope(heads(linear(a, h + "self_attn.k_proj"), nkv), cos, sin)
        v = heads(linear(a, h + "self_attn.v_proj"), nkv)
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        x = x + linear(causal_attention(q, k, v), h + "self_attn.o_proj")
        m = rms_norm(x, t[h + "post_attention_layernorm.weight"], eps)
        gated = torch.nn.functional.silu(linear(m, h + "mlp.gate_proj")) * linear(m, h + "mlp.up_proj")
        x = x + linear(gated, h + "mlp.down_proj")
    x = rms_norm(x, t["model.norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", False)
    head = t["model.embed_tokens.weight"] if tied or "lm_head.weight" not in t else t["lm_head.weight"]
    return x @ head.T


FORWARDS = {"gpt2": gpt2_forward, "llama": llama_forward}


# ----------------------------------------------------------------------------- checks

def compare(hf_dir, logits_path, tokens, tol):
    cfg, tensors = load_hf_dir(hf_dir)
    want = FORWARDS[cfg["model_type"]](cfg, tensors, tokens)
    with open(logits_path, "rb") as f:
        raw = bytearray(f.read())
    got = torch.frombuffer(raw, dtype=torch.float32).to(torch.float64).reshape(want.shape)
    err = (got - want).abs().max().item()
    print("%s: %d tokens x %d logits, max |troupe - reference| = %.3g (tolerance %.3g), "
          "logit range [%.3g, %.3g]" % (cfg["model_type"], want.shape[0], want.shape[1], err, tol,
                                        want.min().item(), want.max().item()))
    return err <= tol


def run(cmd):
    print("$ " + " ".join(cmd))
    # Text, with U+FFFD for bytes that are not UTF-8 (a sampled token may end inside a character).
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace")
    print(p.stdout, end="")
    if p.returncode != 0:
        raise SystemExit("command failed (%d): %s" % (p.returncode, " ".join(cmd)))
    return p.stdout


def spec_value(spec_text, key, default):
    m = re.search(r"\b%s:\s*(\d+)" % key, spec_text)
    return int(m.group(1)) if m else default


def pipeline(args):
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    runs = os.path.join(args.work, "runs")
    run([args.troupe, "run", args.spec, "-q", "--runs-dir", runs])
    found = glob.glob(os.path.join(runs, "*", "ckpt"))
    if len(found) != 1:
        raise SystemExit("expected one run with a checkpoint under %s, found %s" % (runs, found))
    ckpt = found[0]
    hf_dir = os.path.join(args.work, "hf")
    run([args.troupe, "ckpt", "export", ckpt, "--format", "hf", "--out", hf_dir])
    with open(args.spec) as f:
        spec = f.read()
    vocab, seq_len = spec_value(spec, "vocab_size", 256), spec_value(spec, "seq_len", 0)
    # A fixed, varied sequence over the whole vocabulary and every position.
    tokens = [(7 + 37 * i + (i * i) % 11) % vocab for i in range(seq_len)]
    logits = os.path.join(args.work, "logits.f32")
    run([args.dump_logits, ckpt, logits] + [str(x) for x in tokens])
    ok = compare(hf_dir, logits, tokens, args.tol)
    if args.reimport:
        back = os.path.join(args.work, "reimported.f32")
        run([args.dump_logits, "--hf", hf_dir, args.spec, back] + [str(x) for x in tokens])
        print("troupe reading its export back (model.init_from):")
        ok = compare(hf_dir, back, tokens, args.tol) and ok
    return 0 if ok else 1


def finetune(args):
    """docs/training.md "Fine-tune a released model", on a random model of the tokenizer's size."""
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    with open(os.path.join(args.tokenizer_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = 1 + max(max(tok["model"]["vocab"].values()), max(t["id"] for t in tok["added_tokens"]))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    with open(os.path.join(args.tokenizer_dir, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    bos, eos = ids[tcfg["bos_token"]], ids[tcfg["eos_token"]]
    d, layers, nh, nkv, ffn, seq = 32, 2, 4, 2, 64, 32
    rs = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": d,
           "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": d // nh, "hidden_act": "silu", "max_position_embeddings": 131072,
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": rs, "tie_word_embeddings": True,
           "attention_bias": False, "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos,
           "torch_dtype": "float32"}
    g = torch.Generator().manual_seed(1234)
    hs = d // nh

    def rand(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.float32)

    t = {"model.embed_tokens.weight": rand(vocab, d, std=0.1), "model.norm.weight": 1 + rand(d, std=0.1)}
    for i in range(layers):
        h = "model.layers.%d." % i
        t.update({h + "input_layernorm.weight": 1 + rand(d, std=0.1),
                  h + "post_attention_layernorm.weight": 1 + rand(d, std=0.1),
                  h + "self_attn.q_proj.weight": rand(nh * hs, d, std=0.3),
                  h + "self_attn.k_proj.weight": rand(nkv * hs, d, std=0.3),
                  h + "self_attn.v_proj.weight": rand(nkv * hs, d, std=0.3),
                  h + "self_attn.o_proj.weight": rand(d, nh * hs, std=0.3),
                  h + "mlp.gate_proj.weight": rand(ffn, d, std=0.3), h + "mlp.up_proj.weight": rand(ffn, d, std=0.3),
                  h + "mlp.down_proj.weight": rand(d, ffn, std=0.3)})
    src = os.path.join(args.work, "released")
    os.makedirs(src)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(src, "model.safetensors"), t)

    data = os.path.join(args.work, "data")
    run([args.troupe, "data", "tokenize", args.corpus, "--tokenizer", os.path.join(args.tokenizer_dir, "tokenizer.json"),
         "--out", data, "--val-fraction", "0.1"])
    spec = os.path.join(args.work, "finetune.yaml")
    with open(spec, "w") as f:
        f.write("""name: finetune
model:
  type: llama
  vocab_size: %d
  seq_len: %d
  d_model: %d
  n_layers: %d
  n_heads: %d
  n_kv_heads: %d
  ffn_hidden: %d
  rope_theta: 500000.0
  rope_scaling: {type: llama3, factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0,
                 original_max_position_embeddings: 64}
  tie_embeddings: true
  norm_eps: 1.0e-5
  init_from: %s
data:
  source: tokens
  path: %s/train.bin
  val_path: %s/val.bin
  tokenizer: %s/tokenizer.json
  eot: %d
train: {steps: 4, global_batch: 2, seed: 3, warmup_steps: 2, lr_schedule: constant, optimizer: {lr: 0.001},
        eval_every: 4, eval_batches: 1}
""" % (vocab, seq, d, layers, nh, nkv, ffn, src, data, data, data, eos))
    # troupe's import: its logits from the released directory against this forward.
    tokens = [bos] + [(7919 * i + 13) % vocab for i in range(1, seq)]
    imported = os.path.join(args.work, "imported.f32")
    run([args.dump_logits, "--hf", src, spec, imported] + [str(x) for x in tokens])
    print("troupe reading the released model (model.init_from):")
    ok = compare(src, imported, tokens, args.tol)

    runs = os.path.join(args.work, "runs")
    run([args.troupe, "run", spec, "-q", "--runs-dir", runs])
    found = glob.glob(os.path.join(runs, "*", "ckpt"))
    if len(found) != 1:
        raise SystemExit("expected one run with a checkpoint under %s, found %s" % (runs, found))
    ckpt = found[0]
    with open(os.path.join(os.path.dirname(ckpt), "metrics.jsonl")) as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    print("losses %s (a uniform guess over %d ids: %.2f)" % (losses, vocab, math.log(vocab)))
    ok = len(losses) == 4 and all(math.isfinite(x) for x in losses) and ok

    prompt = "The computer"
    out = run([args.troupe, "sample", "--ckpt", ckpt, "--prompt", prompt, "--tokens", "12", "--seed", "1"])
    if not out.startswith(prompt) or len(out) <= len(prompt) + 1:
        print("FAIL: troupe sample did not continue the prompt: %r" % out)
        ok = False

    hf_dir = os.path.join(args.work, "export")
    run([args.troupe, "ckpt", "export", ckpt, "--format", "hf", "--out", hf_dir])
    with open(os.path.join(hf_dir, "config.json")) as f:
        exported = json.load(f)
    for key in ("rope_scaling", "tie_word_embeddings", "rope_theta", "vocab_size"):
        if exported.get(key) != cfg[key]:
            print("FAIL: the export's config.json has %s %r, the released model's %r" % (key, exported.get(key), cfg[key]))
            ok = False
    logits = os.path.join(args.work, "finetuned.f32")
    run([args.dump_logits, ckpt, logits] + [str(x) for x in tokens])
    print("the fine-tuned checkpoint against the forward of its export:")
    ok = compare(hf_dir, logits, tokens, args.tol) and ok
    return 0 if ok else 1


def self_test():
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.5

    def llama(d=16, nh=4, nkv=2, f=24, v=40, layers=2, tie=False):
        hs = d // nh
        cfg = {"model_type": "llama", "hidden_size": d, "num_attention_heads": nh, "num_key_value_heads": nkv,
               "intermediate_size": f, "vocab_size": v, "num_hidden_layers": layers, "rms_norm_eps": 1e-5,
               "rope_theta": 10000.0, "tie_word_embeddings": tie}
        t = {"model.embed_tokens.weight": rand(v, d), "model.norm.weight": 1 + rand(d)}
        if not tie:
            t["lm_head.weight"] = rand(v, d)
        for i in range(layers):
            h = "model.layers.%d." % i
            t.update({h + "input_layernorm.weight": 1 + rand(d), h + "post_attention_layernorm.weight": 1 + rand(d),
                      h + "self_attn.q_proj.weight": rand(nh * hs, d),
                      h + "self_attn.k_proj.weight": rand(nkv * hs, d),
                      h + "self_attn.v_proj.weight": rand(nkv * hs, d),
                      h + "self_attn.o_proj.weight": rand(d, nh * hs), h + "mlp.gate_proj.weight": rand(f, d),
                      h + "mlp.up_proj.weight": rand(f, d), h + "mlp.down_proj.weight": rand(d, f)})
        return cfg, t

    failures = []

    def check(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    tokens = [3, 17, 5, 39, 0, 22, 8, 8, 31]
    cfg, t = llama()
    out = llama_forward(cfg, t, tokens)
    check(tuple(out.shape) == (len(tokens), 40), "llama: logits are (T, V)")
    changed = llama_forward(cfg, t, tokens[:5] + [1, 2, 3, 4])
    check(torch.allclose(out[:5], changed[:5]) and not torch.allclose(out[5:], changed[5:]),
          "llama: causal (later tokens change only later logits)")
    # Grouped-query heads: NKV = 2 equals NKV = NH = 4 with each kv head's rows repeated for
    # the query heads that read it (h // 2).
    full = dict(t)
    wide = dict(cfg, num_key_value_heads=4)
    for i in range(2):
        for n in ("k_proj", "v_proj"):
            w = t["model.layers.%d.self_attn.%s.weight" % (i, n)].reshape(2, 4, 16)
            full["model.layers.%d.self_attn.%s.weight" % (i, n)] = w.repeat_interleave(2, dim=0).reshape(16, 16)
    check(torch.allclose(out, llama_forward(wide, full, tokens)), "llama: query head h reads kv head h // (NH/NKV)")
    # Rotary convention against a per-element loop over the pairs (i, i + HS/2).
    x = rand(2, 6, 8)
    cos, sin = rope_cos_sin(6, 8, 500.0)
    y = apply_rope(x, cos, sin)
    z = torch.empty_like(x)
    for p in range(6):
        for i in range(4):
            a = p * 500.0 ** (-2.0 * i / 8)
            z[:, p, i] = x[:, p, i] * math.cos(a) - x[:, p, i + 4] * math.sin(a)
            z[:, p, i + 4] = x[:, p, i + 4] * math.cos(a) + x[:, p, i] * math.sin(a)
    check(torch.allclose(y, z), "llama: rotary pairs (i, i + HS/2) turned by p * theta^(-2i/HS)")
    # llama3 scaling against its definition per channel, in double: wavelength 2 pi / f above
    # old / low: f / factor; below old / high: f; between: (1 - s) f / factor + s f with
    # s = (old / wavelength - low) / (high - low). HS 16, theta 500, old 32: every regime.
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
    got = rope_inv_freq(16, 500.0, rs)
    regimes = set()
    for i in range(8):
        f = 500.0 ** (-2.0 * i / 16)
        w = 2 * math.pi / f
        if w > 32 / 1.0:
            want, regime = f / 8.0, "low"
        elif w < 32 / 4.0:
            want, regime = f, "high"
        else:
            s = (32 / w - 1.0) / 3.0
            want, regime = (1 - s) * f / 8.0 + s * f, "medium"
        regimes.add(regime)
        check(abs(got[i].item() - want) <= 1e-6 * want, "llama3 rope scaling: channel %d (%s frequency)" % (i, regime))
    check(regimes == {"low", "medium", "high"}, "llama3 rope scaling: the test covers all three regimes")
    cfg_s, t_s = llama()
    cfg_s = dict(cfg_s, rope_scaling=rs)
    check(not torch.allclose(llama_forward(cfg_s, t_s, tokens), out), "llama: rope_scaling changes the logits")
    cfg_t, t_t = llama(tie=True)
    out_t = llama_forward(cfg_t, t_t, tokens)
    t_t["lm_head.weight"] = rand(40, 16)  # ignored when tied
    check(torch.allclose(out_t, llama_forward(cfg_t, t_t, tokens)), "llama: tied head reads embed_tokens")
    # GPT-2: shapes and causality on random tensors.
    d, v, n = 16, 30, 12
    gcfg = {"model_type": "gpt2", "n_embd": d, "n_head": 4, "n_layer": 2, "vocab_size": v, "n_positions": n}
    gt = {"transformer.wte.weight": rand(v, d), "transformer.wpe.weight": rand(n, d),
          "transformer.ln_f.weight": 1 + rand(d), "transformer.ln_f.bias": rand(d)}
    for i in range(2):
        h = "transformer.h.%d." % i
        for name, shape in (("ln_1", (d,)), ("ln_2", (d,))):
            gt[h + name + ".weight"], gt[h + name + ".bias"] = 1 + rand(*shape), rand(*shape)
        for name, i_n, o_n in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d), ("mlp.c_fc", d, 4 * d),
                               ("mlp.c_proj", 4 * d, d)):
            gt[h + name + ".weight"], gt[h + name + ".bias"] = rand(i_n, o_n), rand(o_n)
    gtok = [1, 29, 4, 4, 17, 0, 9]
    gout = gpt2_forward(gcfg, gt, gtok)
    check(tuple(gout.shape) == (len(gtok), v), "gpt2: logits are (T, V)")
    gchanged = gpt2_forward(gcfg, gt, gtok[:3] + [2, 2, 2, 2])
    check(torch.allclose(gout[:3], gchanged[:3]) and not torch.allclose(gout[3:], gchanged[3:]), "gpt2: causal")
    bare = {k[len("transformer."):]: w for k, w in gt.items()}
    check(torch.allclose(gout, gpt2_forward(gcfg, bare, gtok)), "gpt2: names without transformer. read the same")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("pipeline")
    p.add_argument("--troupe", required=True)
    p.add_argument("--dump-logits", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--reimport", action="store_true")
    ft = sub.add_parser("finetune")
    ft.add_argument("--troupe", required=True)
    ft.add_argument("--dump-logits", required=True)
    ft.add_argument("--tokenizer-dir", required=True)
    ft.add_argument("--corpus", required=True)
    ft.add_argument("--work", required=True)
    ft.add_argument("--tol", type=float, default=1e-5)
    c = sub.add_parser("compare")
    c.add_argument("hf_dir")
    c.add_argument("logits")
    c.add_argument("tokens", nargs="+", type=int)
    c.add_argument("--tol", type=float, default=1e-4)
    sub.add_parser("self-test")
    args = ap.parse_args()
    if args.mode == "pipeline":
        return pipeline(args)
    if args.mode == "finetune":
        if not os.path.exists(os.path.join(args.tokenizer_dir, "tokenizer.json")):
            print("SKIPPED: %s/tokenizer.json is missing (bash tests/tokenizer/install.sh installs it)" % args.tokenizer_dir)
            return 77
        return finetune(args)
    if args.mode == "compare":
        return 0 if compare(args.hf_dir, args.logits, args.tokens, args.tol) else 1
    return self_test()


if __name__ == "__main__":
    sys.exit(main())
