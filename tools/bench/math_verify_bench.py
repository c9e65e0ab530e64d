#!/usr/bin/env python3
"""tools/bench/math_verify_bench.py: answers verified per second on one core, dsarl's hf_math_verify (C) and, beside
it in the same run, Python math-verify called as NeMo RL's hf_math_verify calls it, over the same labelled pairs.

    tools/bench/math_verify_bench.py BUILD_DIR [--pairs FILE.jsonl] [--repeat K] [--python VENV_PYTHON]

The C side is BUILD_DIR/tests/math_hf_agreement (pinned to one CPU with taskset when available). The Python side
runs in this interpreter, or in --python's (e.g. a venv with math-verify installed); without math-verify it prints
"python math-verify: not installed". Prints one json line per implementation and the agreement rate."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PAIRS = os.path.join(HERE, "..", "..", "tests", "fixtures", "math_verify", "pairs_10k.jsonl")

PY_WORKER = r'''
import json, logging, os, sys, time
try:
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
except ImportError:
    print(json.dumps({"impl": "python", "status": "not installed"}))
    sys.exit(0)
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
logging.getLogger("math_verify").setLevel(logging.CRITICAL)
f = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
pairs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = time.perf_counter()
correct = 0
for p in pairs:
    try:
        s, _ = f(["\\boxed{" + p["ground_truth"] + "}"], [p["response"]])
    except BaseException:
        s = 0.0
    correct += s == 1.0
dt = time.perf_counter() - t0
import math_verify
print(json.dumps({"impl": "python", "version": getattr(math_verify, "__version__", "?"), "pairs": len(pairs),
                  "correct": correct, "seconds": round(dt, 3), "answers_per_second": round(len(pairs) / dt, 1)}))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter that has math-verify installed")
    args = ap.parse_args()
    tool = os.path.join(args.build, "tests", "math_hf_agreement")
    if not os.path.exists(tool):
        sys.exit(f"{tool}: not built (make math_hf_agreement)")
    cmd = [tool, args.pairs, "--repeat", str(args.repeat), "--json", "--min-rate", "0"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    c["impl"] = "c"
    print("json:", json.dumps(c))
    out = subprocess.run([args.python, "-c", PY_WORKER, args.pairs], capture_output=True, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        print("python math-verify: failed:", out.stderr.strip()[-300:])
        return
    py = json.loads(lines[-1])
    if py.get("status") == "not installed":
        print("python math-verify: not installed")
        return
    print("json:", json.dumps(py))
    print(f"C {c['answers_per_second']:.0f} answers/s, Python {py['answers_per_second']:.0f} answers/s "
          f"({c['answers_per_second'] / py['answers_per_second']:.0f}x), agreement {100 * c['rate']:.2f}% "
          f"on {c['pairs']} pairs")


if __name__ == "__main__":
    main()
