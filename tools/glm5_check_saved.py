#!/usr/bin/env python3
"""glm5_check_saved.py: checks that transformers loads a model directory dsarl saved and computes the same logits.

Usage: python3 tools/glm5_check_saved.py SAVED_DIR FIXTURE_DIR
Loads SAVED_DIR with GlmMoeDsaForCausalLM (eager, fp32), runs FIXTURE_DIR/input_ids.json and compares with
FIXTURE_DIR/logits.npy (max |diff| / max |ref| < 1e-5). Exit 0 on match, 1 on mismatch, 77 when torch or
transformers is not installed (the caller reports a skip).
"""
import json
import sys

try:
    import numpy as np
    import torch
    from transformers import GlmMoeDsaForCausalLM
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skip: {e}")
    sys.exit(77)


def main():
    saved, fixture = sys.argv[1], sys.argv[2]
    model = GlmMoeDsaForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor(json.load(open(f"{fixture}/input_ids.json")))
    ref = np.load(f"{fixture}/logits.npy")
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits.numpy()
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"transformers on {saved}: max relative error {rel:.3g}")
    sys.exit(0 if rel < 1e-5 else 1)


if __name__ == "__main__":
    main()
