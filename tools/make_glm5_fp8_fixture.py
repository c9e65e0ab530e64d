#!/usr/bin/env python3
"""Makes tests/fixtures/glm5/glm5.2-tiny-fp8 from the glm5.2-tiny fixture: an FP8 checkpoint laid out as
DeepSeek-V3 / GLM-5-FP8 releases are (float8 e4m3fn linear weights, a float32 `<key>_scale_inv` per block of
weight_block_size, quantization_config in config.json), with one MTP layer (layer num_hidden_layers, FP8 and bf16
tensors) that the loader must carry through a save unchanged, and reference.safetensors: every parameter the model
builds, dequantized here (float32) with ml_dtypes, independently of the C loader.

Run at fixture-making time only:
    python3 -m venv /tmp/fp8 && /tmp/fp8/bin/pip install numpy ml_dtypes safetensors
    /tmp/fp8/bin/python tools/make_glm5_fp8_fixture.py
"""
import json
import os
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

BLOCK = (16, 16)  # small blocks, so the tiny weights have several, and partial ones (8-wide experts)
FP8_MAX = 448.0   # the largest finite e4m3fn value
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests", "fixtures", "glm5", "glm5.2-tiny")
DST = os.path.join(ROOT, "tests", "fixtures", "glm5", "glm5.2-tiny-fp8")


def quantized(name):
    """The weights FP8 releases store in float8: linear projections, not norms, embeddings, router or LM head."""
    if not name.endswith(".weight") or name.startswith(("model.embed_tokens", "lm_head")):
        return False
    leaf = name.rsplit(".", 2)[-2]
    return leaf.endswith("_proj") and leaf != "weights_proj" or leaf in ("kv_a_proj_with_mqa", "wq_b", "wk")


def quantize(w):
    """float32 (R, C) -> e4m3fn codes (R, C) and float32 scale_inv (ceil(R/b0), ceil(C/b1)), amax / 448 per block."""
    R, C = w.shape
    b0, b1 = BLOCK
    SR, SC = -(-R // b0), -(-C // b1)
    scale = np.zeros((SR, SC), np.float32)
    q = np.zeros((R, C), ml_dtypes.float8_e4m3fn)
    for i in range(SR):
        for j in range(SC):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            s = np.float32(max(float(np.abs(blk).max()), 1e-12) / FP8_MAX)
            scale[i, j] = s
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (blk / s).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


def dequantize(q, scale):
    b0, b1 = BLOCK
    full = np.repeat(np.repeat(scale, b0, axis=0), b1, axis=1)[: q.shape[0], : q.shape[1]]
    return (q.astype(np.float32) * full).astype(np.float32)


def main():
    rng = np.random.default_rng(20261202)
    src = {k: v.astype(np.float32) for k, v in load_file(os.path.join(SRC, "model.safetensors")).items()}
    with open(os.path.join(SRC, "config.json")) as f:
        config = json.load(f)
    layers = config["num_hidden_layers"]
    out, ref = {}, {}
    for name, w in sorted(src.items()):
        if quantized(name):
            q, s = quantize(w)
            out[name], out[name + "_scale_inv"] = q, s
            ref[name] = dequantize(q, s)
        else:
            out[name] = w.astype(ml_dtypes.bfloat16)
            ref[name] = out[name].astype(np.float32)
    # one MTP layer after the last: its own norms and projection (bf16) and a quantized attention projection
    hidden = config["hidden_size"]
    mtp = f"model.layers.{layers}"
    out[f"{mtp}.enorm.weight"] = rng.normal(1, 0.1, hidden).astype(ml_dtypes.bfloat16)
    out[f"{mtp}.hnorm.weight"] = rng.normal(1, 0.1, hidden).astype(ml_dtypes.bfloat16)
    out[f"{mtp}.eh_proj.weight"] = rng.normal(0, 0.05, (hidden, 2 * hidden)).astype(ml_dtypes.bfloat16)
    q, s = quantize(rng.normal(0, 0.05, (config["q_lora_rank"], hidden)).astype(np.float32))
    out[f"{mtp}.self_attn.q_a_proj.weight"], out[f"{mtp}.self_attn.q_a_proj.weight_scale_inv"] = q, s
    os.makedirs(DST, exist_ok=True)
    # safetensors.numpy names float8 arrays F8_E4M3 and bfloat16 ones BF16
    save_file(out, os.path.join(DST, "model.safetensors"), metadata={"format": "pt"})
    save_file(ref, os.path.join(DST, "reference.safetensors"), metadata={"format": "pt"})
    config["num_nextn_predict_layers"] = 1
    config["dtype"] = "bfloat16"
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": list(BLOCK)}
    with open(os.path.join(DST, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    n_q = sum(1 for k in out if k.endswith("_scale_inv"))
    print(f"{DST}: {len(out)} tensors ({n_q} FP8 with scales), reference of {len(ref)}", file=sys.stderr)


if __name__ == "__main__":
    main()
