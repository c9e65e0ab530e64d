#!/usr/bin/env python3
"""glm5_check_saved.py: checks that transformers loads a model directory dsarl saved and computes the same logits.

Usage: python3 tools/glm5_check_saved.py SAVED_DIR INPUT_IDS.json REF_LOGITS.npy
Loads SAVED_DIR with GlmMoeDsaForCausalLM (eager, fp32), runs the rows of INPUT_IDS.json and compares with
REF_LOGITS.npy [B, S, V] (max |diff| / max |ref| < 1e-4). Exit 0 on match, 1 on mismatch, 77 when torch or
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
    saved, ids_path, ref_path = sys.argv[1], sys.argv[2], sys.argv[3]
    model = GlmMoeDsaForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor(json.load(open(ids_path)))
    ref = np.load(ref_path)
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits.numpy()
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"transformers on {saved}: max relative error {rel:.3g}")
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    main()
