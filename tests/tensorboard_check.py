#!/usr/bin/env python3
"""tensorboard_check.py EXP_DIR: loads EXP_DIR/tensorboard with TensorBoard's own EventAccumulator and checks that
every finite scalar of EXP_DIR/metrics.jsonl is there with its step and value (float32). Exits 77 (skipped) when
tensorboard is not importable."""
import json
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except Exception as e:  # noqa: BLE001 - any import problem means "no TensorBoard here"
    print(f"tensorboard not importable ({e}); skipped")
    sys.exit(77)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    exp = sys.argv[1]
    acc = event_accumulator.EventAccumulator(os.path.join(exp, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {}
    with open(os.path.join(exp, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            for k, v in row.items():
                if k != "step" and v is not None and math.isfinite(v):
                    want.setdefault(k, []).append((row["step"], f32(v)))
    assert want, "metrics.jsonl is empty"
    assert tags == set(want), f"tags {sorted(tags)} != {sorted(want)}"
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == points, f"{tag}: {got} != {points}"
    print(f"TensorBoard read {len(tags)} tags, {sum(len(p) for p in want.values())} points: OK")


if __name__ == "__main__":
    main()
