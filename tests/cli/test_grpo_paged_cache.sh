#!/usr/bin/env bash
# test_grpo_paged_cache.sh BUILD_DIR SOURCE_DIR: the tiny GLM-5.2 GRPO recipe for 2 steps with the contiguous
# generation cache, the paged one without prefix sharing, and the paged one with it (the default). Without sharing
# every forward sees the contiguous run's batches, so every metric but timings must be equal bit for bit; with
# sharing (a group of G prompts prefilled once) the rewards, lengths and losses must be equal and the log-prob
# metrics may move by float rounding only: token_mult_prob_error stays within 1e-6 of 1.
set -uo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(runtime.device=cpu runtime.threads=1 grpo.max_num_steps=2 grpo.num_prompts_per_step=4
        grpo.num_generations_per_prompt=4 policy.train_global_batch_size=16 policy.train_micro_batch_size=8
        grpo.val_at_start=false grpo.val_at_end=false grpo.val_period=0 checkpointing.enabled=false
        policy.generation.max_new_tokens=16)
run() { # run NAME OVERRIDES...
  local name=$1
  shift
  "$build/bin/dsarl" run "$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml" "${common[@]}" logger.log_dir="$tmp/$name" \
    "$@" >"$tmp/$name.log" 2>&1 || { tail -n 20 "$tmp/$name.log"; echo "FAIL: $name"; exit 1; }
}
run contiguous +policy.generation.paged_kv_cache=false
run paged +policy.generation.enable_prefix_caching=false
run shared
python3 - "$tmp/contiguous/exp_001/metrics.jsonl" "$tmp/paged/exp_001/metrics.jsonl" \
  "$tmp/shared/exp_001/metrics.jsonl" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:]]
contiguous, paged, shared = rows
assert len(contiguous) == len(paged) == len(shared) == 2, [len(r) for r in rows]
rounding = ("logprob", "prob_error", "kl_error", "js_divergence", "importance_ratio", "entropy", "tokens_per_s")
for a, b, c in zip(contiguous, paged, shared):
    for k, va in a.items():
        if k.startswith("timing/") or "per_s" in k or not isinstance(va, (int, float)):
            continue
        assert b.get(k) == va, f"step {a.get('step')}: {k} paged {b.get(k)} vs contiguous {va}"
        if not any(r in k for r in rounding):
            assert c.get(k) == va, f"step {a.get('step')}: {k} shared {c.get(k)} vs contiguous {va}"
    assert abs(c["train/token_mult_prob_error"] - 1.0) <= 1e-6, c["train/token_mult_prob_error"]
print("paged = contiguous on every metric; shared prefill: same rewards and losses, token_mult_prob_error",
      [round(c["train/token_mult_prob_error"], 9) for c in shared])
PY
