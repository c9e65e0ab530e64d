#!/usr/bin/env python3
"""Writes tests/fixtures/safetensors/python_fixture.safetensors (+ .expected.txt) with the Python reference stack.

The file holds one tensor per dtype, written by the `safetensors` package, and two conversions made by the
reference libraries from the same float32 values: torch's float32 -> bfloat16 and numpy's float32 -> float16
(both round to nearest even). check_safetensors.c reads it and checks that dsarl sees the exact values and that
dsarl's own conversions give the same bits. The .expected.txt sidecar lists every element's bits in hex, one
tensor per line: `name dtype ndim dim... count hex...`, so the C test does not need our reader to be right to
know the truth. Run from the repository root: python3 tools/make_safetensors_fixture.py
"""
import os

import numpy as np
import torch
from safetensors.torch import save_file

OUT_DIR = os.path.join("tests", "fixtures", "safetensors")


def special_f32():
    """Bit patterns at the rounding corners of bf16 and fp16, as float32."""
    bits = [
        0x3F808000, 0x3F818000, 0x3F808001, 0xBF818000,  # bf16 ties and near-ties
        0x7F7FFFFF, 0x00018000, 0x007FFFFF, 0x80000000,  # overflow to inf, subnormals, -0
        0x477FF000, 0x477FE000, 0x33800000, 0x33000000,  # 65520 (f16 inf), 65504, 2^-24, 2^-25
        0x7F800000, 0xFF800000, 0x7FC00000, 0x3DCCCCCD,  # inf, -inf, canonical NaN, 0.1
    ]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def main():
    rng = np.random.default_rng(20261130)
    randoms = (rng.standard_normal(32) * np.exp2(rng.integers(-20, 20, 32))).astype(np.float32)
    values = np.concatenate([special_f32(), randoms]).reshape(4, 12)
    with np.errstate(over="ignore"):
        f16 = values.astype(np.float16)
    bf16 = torch.from_numpy(values.copy()).to(torch.bfloat16)
    tensors = {
        "values.f32": torch.from_numpy(values.copy()),
        "values.bf16_torch": bf16,
        "values.f16_numpy": torch.from_numpy(f16.copy()),
        "ints.i64": torch.tensor([[-(2**40), 3, 7], [2**62, -1, 0]], dtype=torch.int64),
        "ints.i32": torch.tensor([-(2**31), 2**31 - 1, 12345], dtype=torch.int32),
        "bytes.u8": torch.tensor([0, 1, 254, 255, 128], dtype=torch.uint8),
        "bytes.i8": torch.tensor([-128, 127, -1], dtype=torch.int8),
        "mask.bool": torch.tensor([True, False, True, True], dtype=torch.bool),
        "wide.f64": torch.tensor([[3.141592653589793], [-1e-300]], dtype=torch.float64),
        "scalar.f32": torch.tensor(2.5, dtype=torch.float32),
        "empty.f32": torch.zeros((0, 4), dtype=torch.float32),
    }
    path = os.path.join(OUT_DIR, "python_fixture.safetensors")
    # One metadata key: the Rust writer stores metadata in a hash map, so with several keys their order (and
    # therefore the file's bytes) would not be reproducible.
    save_file(tensors, path, metadata={"format": "pt"})

    dtype_names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                   torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL"}
    with open(os.path.join(OUT_DIR, "python_fixture.expected.txt"), "w") as f:
        for name, t in sorted(tensors.items()):
            raw = t.contiguous().view(-1)
            if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
                words = raw.view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)
            elif t.dtype == torch.bool or t.dtype == torch.uint8 or t.dtype == torch.int8:
                words = raw.view(torch.uint8).numpy().astype(np.uint64)
            elif t.dtype in (torch.float32, torch.int32):
                words = raw.view(torch.int32).numpy().view(np.uint32).astype(np.uint64)
            else:
                words = raw.view(torch.int64).numpy().view(np.uint64)
            dims = " ".join(str(d) for d in t.shape)
            hexes = " ".join("%x" % int(w) for w in words)
            f.write(f"{name} {dtype_names[t.dtype]} {t.dim()} {dims}{' ' if dims else ''}{len(words)} {hexes}\n")
    print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
