#!/usr/bin/env python3
"""dp_compare.py: the comparisons of the data-parallel CLI tests (test_dp_grpo.sh, test_dp_sft.sh).
  dp_compare.py metrics A_LOG_DIR B_LOG_DIR [STEP]  every logged metric of every step (only STEP when given) of two
                                                  runs agrees within 1e-5 relative on the first step
                                                  and 3e-4 after it (timings excepted), and so do the
                                                  prompt/response sample dumps; DP_COMPARE_IGNORE (comma-separated
                                                  names) drops metrics only one layout logs, and
                                                  DP_COMPARE_EXACT=1 asks every value bit for bit
  dp_compare.py weights A_DIR B_DIR [TOL]         two model.safetensors agree within TOL (1e-5) relative per tensor
                                                  (to the tensor's largest value)
  dp_compare.py agree DIR                         every step of one run scores its tokens as the engine drew them:
                                                  train/gen_kl_error <= 1e-10 and train/token_mult_prob_error
                                                  within 1e-6 of 1 (float rounding: 1e-14 and 1e-7 on the CPU). A
                                                  top-k near-tie that went one way in the engine and the other in
                                                  the trainer gives 1e-6 and 1e-4 from a single token"""
import glob, json, os, struct, sys


def compare_metrics(a_dir, b_dir, only):
    def metrics(d):
        (path,) = glob.glob(d + "/exp_*/metrics.jsonl")
        return {r["step"]: r for r in map(json.loads, open(path))}
    a, b = metrics(a_dir), metrics(b_dir)
    steps = [int(only)] if only else sorted(a)
    assert steps and all(s in a and s in b for s in steps), f"steps {sorted(a)} vs {sorted(b)}"
    worst, n = 0.0, 0
    exact = os.environ.get("DP_COMPARE_EXACT") == "1"
    ignored = set(filter(None, os.environ.get("DP_COMPARE_IGNORE", "").split(",")))

    def names(r):
        return {k for k in r if not k.startswith("timing/") and k not in ignored}

    for s in steps:
        assert names(a[s]) == names(b[s]), f"step {s}: metric names differ: {names(a[s]) ^ names(b[s])}"
        for k, x in a[s].items():
            if k.startswith("timing/") or k == "train/tokens_per_sec" or k in ignored or k not in b[s]:
                continue
            y = b[s][k]
            if x is None or y is None:
                assert x is None and y is None, f"step {s} {k}: {x} vs {y}"
                continue
            # the KL estimators of an on-policy step are ~1e-15 rounding noise: an absolute floor for them
            d = abs(x - y) / max(abs(x), abs(y), 1e-6)
            assert not exact or x == y, f"step {s} {k}: {x!r} vs {y!r} (not bit for bit)"
            # the first step starts from the same weights: only the summation order of the layouts differs (1e-5).
            # After an AdamW step the weights differ by more than the gradients did (the step divides by sqrt(v),
            # so near-zero gradient elements move the weights by much more than their rounding), and a later
            # step's extremes (probs_ratio_min) carry that: 3e-4 there
            tol = 1e-5 if s == steps[0] else 3e-4
            assert abs(x - y) <= 1e-9 or d <= tol, f"step {s} {k}: {x} vs {y} (relative {d:.3g}, tolerance {tol:g})"
            worst, n = max(worst, d if abs(x - y) > 1e-9 else 0.0), n + 1
    for s in steps:
        for kind in ("train", "val"):
            pa = glob.glob(f"{a_dir}/exp_*/{kind}_data_step{s}.jsonl")
            pb = glob.glob(f"{b_dir}/exp_*/{kind}_data_step{s}.jsonl")
            assert len(pa) == len(pb), f"{kind} samples of step {s}: {pa} vs {pb}"
            for x, y in zip(pa, pb):
                ra, rb = [json.loads(l) for l in open(x)], [json.loads(l) for l in open(y)]
                assert [(r["prompt"], r["response"]) for r in ra] == [(r["prompt"], r["response"]) for r in rb], \
                    f"{kind} samples of step {s} differ"
    print(f"{os.path.basename(a_dir)} = {os.path.basename(b_dir)}: {n} values, max relative difference {worst:.3g}")


def check_agreement(d):
    """Per step of the run logged under d: the trainer's log-probs are the engine's to float rounding."""
    (path,) = glob.glob(d + "/exp_*/metrics.jsonl")
    rows = [json.loads(l) for l in open(path)]
    assert rows, f"{path} logs no step"
    for r in rows:
        kl, tmpe = r["train/gen_kl_error"], r["train/token_mult_prob_error"]
        assert kl <= 1e-10 and abs(tmpe - 1) <= 1e-6, \
            f"step {r['step']}: gen_kl_error {kl:.3g}, token_mult_prob_error {tmpe!r}: the trainer scored some " \
            f"token otherwise than the engine drew it"
    worst = max(r["train/gen_kl_error"] for r in rows)
    print(f"{os.path.basename(d)}: {len(rows)} steps agree with the engine, gen_kl_error at most {worst:.3g}")


def tensors(path):
    """{name: list of floats} of a float32 safetensors file (no numpy needed)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{path}: {name} is {t['dtype']}"
        a, b = t["data_offsets"]
        out[name] = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
    return out


def compare_weights(a_dir, b_dir, tol):
    a, b = tensors(a_dir + "/model.safetensors"), tensors(b_dir + "/model.safetensors")
    assert set(a) == set(b), f"tensor names differ: {set(a) ^ set(b)}"
    worst = 0.0
    for name in a:
        big = max(1e-6, max(abs(v) for v in b[name]))
        d = max(abs(x - y) for x, y in zip(a[name], b[name])) / big
        assert d <= tol, f"{name}: relative difference {d:.3g}"
        worst = max(worst, d)
    print(f"weights {a_dir} = {b_dir}: {len(a)} tensors, max relative difference {worst:.3g}")


if __name__ == "__main__":
    if sys.argv[1] == "metrics":
        compare_metrics(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    elif sys.argv[1] == "agree":
        check_agreement(sys.argv[2])
    else:
        compare_weights(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5)
