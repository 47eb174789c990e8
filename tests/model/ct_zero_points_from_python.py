#!/usr/bin/env python3
"""ct_zero_points_from_python: compressed-tensors files older than its
_skip_zp (about 0.9) stored zero points for symmetric weights too, as I8
zeros. Such a file is rewritten here in Python from make-model's symmetric
ct-w4a16 checkpoint (every weight_packed gains a weight_zero_point of I8
zeros, the tensors laid out anew as safetensors lays them out): moeserve
loads it and answers exactly as from the file without them. A nonzero zero
point beside a symmetric config is refused, naming the tensor."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

BIN = os.environ["MOESERVE_BIN"]
ESZ = {"I64": 8, "F64": 8, "I32": 4, "F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1}


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
               for k, v in header.items()}
    return meta, tensors


def write_st(path, meta, tensors):
    # Wider elements first, then by name, as safetensors' serializer orders them.
    names = sorted(tensors, key=lambda k: (-ESZ[tensors[k][0]], k))
    header, off, blobs = {}, 0, []
    if meta is not None:
        header["__metadata__"] = meta
    for k in names:
        dt, shape, b = tensors[k]
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def generate(d):
    p = subprocess.run([BIN, "generate", d, "--prompt", "The quick brown fox", "--max-tokens", "12", "--temperature", "0",
                        "--cache-dir", "none"], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


work = tempfile.mkdtemp()
try:
    base = os.path.join(work, "ct")
    subprocess.run([BIN, "make-model", "--shape", "tiny", "--out", base, "--quantization", "ct-w4a16",
                    "--group-size", "32"], check=True, capture_output=True)
    rc, want, err = generate(base)
    assert rc == 0 and want, err
    meta, tensors = read_st(os.path.join(base, "model.safetensors"))
    for label, value in (("zeros", 0), ("nonzero", 3)):
        d = os.path.join(work, label)
        shutil.copytree(base, d)
        t = dict(tensors)
        first = None
        for k, (dt, shape, b) in tensors.items():
            if k.endswith(".weight_scale") and k[:-len("weight_scale")] + "weight_packed" in tensors:
                zp = bytearray(shape[0] * shape[1])
                if first is None:
                    first = k[:-len(".weight_scale")]
                    zp[0] = value
                t[k[:-len("weight_scale")] + "weight_zero_point"] = ("I8", shape, bytes(zp))
        write_st(os.path.join(d, "model.safetensors"), meta, t)
        rc, got, err = generate(d)
        if value == 0:
            if rc != 0 or got != want:
                sys.exit(f"FAIL: I8 zero points of 0 beside a symmetric config: rc={rc} got={got!r} "
                         f"want={want!r} err={err[-400:]}")
        elif rc == 0 or f"{first}.weight_zero_point" not in err or "symmetric" not in err:
            sys.exit(f"FAIL: a nonzero zero point beside a symmetric config should be refused: rc={rc} "
                     f"err={err[-400:]}")
    print("ok: an older file's I8 zero points of 0 load as symmetric; a nonzero one is refused")
finally:
    shutil.rmtree(work)
