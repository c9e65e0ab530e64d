#!/usr/bin/env bash
# test_bench_comm.sh BUILD_DIR MPIEXEC [MPIEXEC_FLAGS...]: `dsarl bench comm` on the cpu device under
# `mpirun -np 2` (--sizes small, 2 iterations): every collective is timed with a positive algorithm and bus
# bandwidth, the bus bandwidth is nccl-tests' factor times the algorithm bandwidth for 2 ranks, the sizes are the
# small set's, and the ceiling is the measured memcpy. Then a world of one (no mpirun) still runs and says so, a
# byte-size sweep runs every collective, and a bad option is refused with one error line and exit status 2.
set -uo pipefail
build=$1 mpiexec=$2
shift 2
dsarl="$build/bin/dsarl"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$mpiexec" -np 2 "$@" "$dsarl" bench comm --device cpu --iters 2 --sizes small >"$tmp/np2" 2>"$tmp/np2.err" ||
  fail "np 2: exit status $?; stderr: $(head -c 800 "$tmp/np2.err")"
cat "$tmp/np2"
python3 - "$tmp/np2" 2 small <<'PY' || fail "np 2: figures (see above)"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
n, sizes = int(sys.argv[2]), sys.argv[3]
rec = [json.loads(l[6:]) for l in lines if l.startswith("json: ")]
ceil = [r for r in rec if r["op"] == "ceilings"]
assert len(ceil) == 1 and ceil[0]["ranks"] == n, ceil
cases = [r for r in rec if r["op"] != "ceilings"]
factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
          "all_to_all": (n - 1) / n, "broadcast": 1.0}
assert {r["op"] for r in cases} == set(factor), f"collectives timed: {sorted({r['op'] for r in cases})}"
for r in cases:
    assert r["ranks"] == n and r["ms"] > 0 and r["bytes"] > 0, r
    assert r["algbw_gbs"] > 0 and r["busbw_gbs"] > 0, f"bandwidth not positive: {r}"
    assert abs(r["algbw_gbs"] - r["bytes"] / r["ms"] / 1e6) <= 1e-4 * r["algbw_gbs"], f"algbw != bytes / time: {r}"
    want = r["algbw_gbs"] * factor[r["op"]]
    assert abs(r["busbw_gbs"] - want) <= 1e-4 * want, f"busbw {r['busbw_gbs']} != algbw x {factor[r['op']]}: {r}"
    if n > 1:
        assert r["ceiling_gbs"] == ceil[0]["link_gbs"] > 0, r
if sizes == "small":
    # the small set: 64 tokens x 6144 hidden (f32 on the cpu), 65536-value buckets; the dispatch sends every one
    # of 64 x 8 (token, expert) rows of 6144 values
    act, bucket, dispatch = 64 * 6144 * 4, 65536 * 4, 64 * 8 * 6144 * 4
    want = {("all_reduce", act), ("all_reduce", bucket), ("all_gather", act), ("all_gather", bucket),
            ("reduce_scatter", act), ("reduce_scatter", bucket), ("all_to_all", dispatch), ("broadcast", bucket)}
    got = {(r["op"], r["bytes"]) for r in cases}
    assert got == want, f"sizes: got {sorted(got)}, want {sorted(want)}"
assert any(l.startswith("ceiling: host memcpy") for l in lines), "the ceiling line is missing"
print(f"bench comm ok: {len(cases)} cases over {n} ranks")
PY

# a world of one: no mpirun, the collectives still run through the device; no link, so no ceiling
"$dsarl" bench comm --device cpu --iters 1 --sizes small >"$tmp/np1" 2>"$tmp/np1.err" ||
  fail "world of one: exit status $?; stderr: $(head -c 800 "$tmp/np1.err")"
grep -q "a world of one" "$tmp/np1" || fail "world of one: not said: $(head -3 "$tmp/np1")"
python3 - "$tmp/np1" <<'PY' || fail "world of one: figures (see above)"
import json, sys
rec = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("json: ") and '"ceilings"' not in l]
assert len(rec) == 8 and all(r["ranks"] == 1 and r["busbw_gbs"] == 0 for r in rec), rec
for r in rec:  # the in-place collectives move nothing; the others are local copies with a rate
    in_place = r["op"] in ("all_reduce", "broadcast")
    assert (r["algbw_gbs"] == 0 and "note" in r) if in_place else (r["algbw_gbs"] > 0 and "note" not in r), r
PY

# a sweep of byte sizes: each size runs the five collectives
"$mpiexec" -np 2 "$@" "$dsarl" bench comm --device cpu --iters 1 --sizes 64K,1M >"$tmp/sweep" 2>"$tmp/sweep.err" ||
  fail "sweep: exit status $?; stderr: $(head -c 800 "$tmp/sweep.err")"
[ "$(grep -c '^json: .*"case": "sweep' "$tmp/sweep")" -eq 10 ] || fail "sweep: expected 10 cases: $(cat "$tmp/sweep")"

# bad options: one error line naming the option, exit status 2
for args in "--sizes nonsense" "--iters 0" "--frobnicate 1"; do
  # shellcheck disable=SC2086
  "$dsarl" bench comm $args >"$tmp/bad" 2>"$tmp/bad.err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "'$args': exit status $rc, wanted 2"
  [ "$(grep -c error "$tmp/bad.err")" -eq 1 ] || fail "'$args': expected one error line: $(cat "$tmp/bad.err")"
done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "test_bench_comm: ok"
