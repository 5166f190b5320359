"""Reads a safetensors file with nothing but json + struct and prints, per tensor,
"name [d0, d1] sum"; then loads it with torch (when installed) and compares."""
import json
import struct
import sys

path = sys.argv[1]
with open(path, "rb") as f:
    blob = f.read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
meta = header.pop("__metadata__", {})
assert meta.get("format") == "pt", meta
base = 8 + n
sums = {}
print("tensors", len(header))
for name in sorted(header):
    info = header[name]
    assert info["dtype"] == "F32", info
    begin, end = info["data_offsets"]
    count = (end - begin) // 4
    values = struct.unpack("<%df" % count, blob[base + begin:base + end])
    shape = info["shape"]
    numel = 1
    for d in shape:
        numel *= d
    assert numel == count, (name, shape, count)
    sums[name] = sum(values)
    print("%s [%s] %.9g" % (name, ", ".join(str(d) for d in shape), sums[name]))

try:
    import torch
except ImportError as e:
    print("torch: skipped (%s)" % e)
    sys.exit(0)
try:
    from safetensors.torch import load_file
    state = load_file(path)
    how = "safetensors.torch.load_file"
except ImportError:
    # Without the safetensors package: torch tensors straight over the file's bytes.
    state = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(blob[base + begin:base + end]), dtype=torch.float32)
        state[name] = t.reshape(info["shape"])
    how = "torch.frombuffer"
bad = [k for k in sums if list(state[k].shape) != header[k]["shape"] or
       abs(float(state[k].double().sum()) - sums[k]) > 1e-3 * max(1.0, abs(sums[k]))]
print("torch: MISMATCH %s" % bad if bad else "torch: ok (%d tensors via %s)" % (len(state), how))
