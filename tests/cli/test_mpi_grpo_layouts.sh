#!/usr/bin/env bash
# test_mpi_grpo_layouts.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAGS...] -- LAYOUT...: the tiny GLM-5.2 GRPO
# recipe trained one process and under each layout (N:override,override,...) on the cpu device; every layout's
# metrics.jsonl must equal the one-process run's, step by step, within fp32 rounding (timing keys dropped). The
# recipe is shrunk to a few seconds per step; the sizes divide every layout listed (4 heads, vocabulary 260,
# 8 experts, 16 samples per step). Rewards come from the overlong shaping of responses that end early (stop ids 0..14
# of the byte tokenizer), so advantages, the loss and the gradients are not zero from random weights.
#   e.g. ... -- "2:policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true"
set -uo pipefail
build=$1 src=$2 mpiexec=$3
shift 3
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
recipe="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
common=(runtime.device=cpu runtime.threads=1 policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference
        grpo.max_num_steps=3 grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=4
        policy.train_global_batch_size=16 policy.train_micro_batch_size=4
        grpo.val_at_start=false grpo.val_at_end=false grpo.val_period=0 checkpointing.enabled=false
        policy.megatron_cfg.scheduler.lr_warmup_iters=0 policy.megatron_cfg.optimizer.lr=1.0e-3
        policy.make_sequence_length_divisible_by=4
        grpo.reward_shaping.enabled=true grpo.reward_shaping.overlong_buffer_length=12
        grpo.reward_shaping.max_response_length=16 "policy.generation.stop_token_ids=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]"
        policy.generation.max_new_tokens=16)
run() { # run NAME NP OVERRIDES...
  local name=$1 np=$2
  shift 2
  local launcher=()
  [ "$np" -gt 1 ] && launcher=("$mpiexec" -np "$np" "${flags[@]}")
  local start=$(date +%s.%N)
  "${launcher[@]}" "$build/bin/dsarl" run "$recipe" "${common[@]}" logger.log_dir="$tmp/$name" \
    cluster.gpus_per_node="$np" "$@" >"$tmp/$name.log" 2>&1 || { tail -n 20 "$tmp/$name.log"; echo "FAIL: $name"; exit 1; }
  printf '%s: %.1f s\n' "$name" "$(echo "$(date +%s.%N) - $start" | bc)"
}
run single 1
status=0
for layout in "$@"; do
  np=${layout%%:*} rest=${layout#*:}
  name=$(echo "$rest" | tr ',=.' '___' | cut -c1-80)
  IFS=, read -r -a overrides <<<"$rest"
  run "$name" "$np" "${overrides[@]}"
  python3 - "$tmp/single/exp_001/metrics.jsonl" "$tmp/$name/exp_001/metrics.jsonl" "$layout" <<'PY' || status=1
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
layout = sys.argv[3]
assert len(a) == len(b) and len(a) >= 3, f"{layout}: {len(a)} vs {len(b)} metric rows"
worst, where = 0.0, ""
for ra, rb in zip(a, b):
    for k, va in ra.items():
        if k.startswith("timing/") or "per_second" in k or "tokens_per_s" in k or "mfu" in k or not isinstance(va, (int, float)):
            continue
        vb = rb.get(k)
        assert isinstance(vb, (int, float)), f"{layout}: step {ra.get('step')}: {k} missing"
        d = abs(va - vb) / max(1e-6, abs(va))
        if d > worst:
            worst, where = d, f"step {ra.get('step')} {k}: {va} vs {vb}"
print(f"{layout}: {len(a)} rows, worst relative difference {worst:.2e} ({where})")
assert worst <= 1e-4, f"{layout}: metrics differ from the one-process run: {where}"
PY
done
exit $status
