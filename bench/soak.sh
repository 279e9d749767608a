#!/usr/bin/env bash
# Soak test of the job life cycle: many consecutive launches of real jobs,
# each under a timeout, counting every failure, hang and crash.
#
#   bench/soak.sh [N] [M]        (defaults: 200 20)
#
# N launches of the a9a job (../shared/data/a9a) cycling through BSP, SSP and
# ASP, then M launches of 4 servers x 16 workers in BSP on the synthetic
# quick-start data, cut to 200k rows and 1 epoch so that 20 launches take
# minutes (the end-of-job shutdown, where pulls are in flight, is the same). A launch passes when ps_launch exits 0 within its timeout,
# its report says "status": "ok", and (BSP) its model files are byte-identical
# to the first BSP run of the same job, and it had no failover (nothing is
# killed: a failover is a false alarm). Failed runs keep their output under
# $PS_SOAK_DIR (default runs/soak/); passing runs are removed. The last line
# is "<passed> passed, <failed> failed".
#
# Environment: PS_SOAK_DIR, PS_SOAK_TIMEOUT_S (per launch, default 120),
# PS_BIN_DIR (default build/bin).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N="${1:-200}"
M="${2:-20}"
BIN="${PS_BIN_DIR:-$ROOT/build/bin}"
OUT="${PS_SOAK_DIR:-$ROOT/runs/soak}"
TIMEOUT="${PS_SOAK_TIMEOUT_S:-120}"
A9A_CONFIG="$ROOT/deploy/configs/a9a.yaml"
SYN_CONFIG="$ROOT/deploy/configs/quickstart.yaml"

if [[ ! -x "$BIN/ps_launch" ]]; then
  echo "soak: $BIN/ps_launch not found; build first (deploy/build.sh)" >&2
  exit 2
fi
if [[ "$N" -gt 0 && ! -f "$ROOT/../shared/data/a9a/a9a.train" ]]; then
  echo "soak: ../shared/data/a9a not found (needed for the a9a launches)" >&2
  exit 2
fi
mkdir -p "$OUT"
rm -rf "${OUT:?}"/run-* "$OUT"/summary.txt

passed=0
failed=0
hangs=0
crashes=0
false_failovers=0
declare -A reference   # job kind -> md5 of its BSP model
start_all=$(date +%s)

# model_md5 DIR: one checksum over every binary model shard, in name order.
model_md5() {
  (cd "$1" && find . -name '*.bin' -type f | LC_ALL=C sort | xargs -r cat) |
    md5sum | cut -d' ' -f1
}

# launch KIND IDX MODE ARGS...: one job; updates the counters.
launch() {
  local kind="$1" idx="$2" mode="$3"
  shift 3
  local dir="$OUT/run-$kind-$idx-$mode"
  rm -rf "$dir"
  mkdir -p "$dir"
  local t0=$(date +%s.%N)
  timeout -k 10 "$TIMEOUT" "$BIN/ps_launch" "$@" --mode "$mode" \
    --run-dir "$dir/run" --report "$dir/report.json" \
    --set "output.model_dir=$dir/model" >"$dir/output.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  local secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local why=""
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    why="hang (timeout ${TIMEOUT}s)"
    hangs=$((hangs + 1))
  elif [[ $rc -ne 0 ]]; then
    why="exit status $rc"
  elif ! grep -q '"status": "ok"' "$dir/report.json" 2>/dev/null; then
    why="report missing or not ok"
  elif ! grep -q '"failovers": \[\]' "$dir/report.json"; then
    # Nothing is killed here: any failover is a false alarm (issue 9).
    # The report is indented JSON (proto/report.proto): one line per value.
    why="false failover: $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["failovers"]))' "$dir/report.json" | cut -c1-300)"
    false_failovers=$((false_failovers + 1))
  fi
  if grep -qE 'killed by signal (11|6|7|4|8)|Segmentation|AddressSanitizer|terminate called' \
      "$dir/output.log"; then
    why="${why:+$why; }crash in output"
    crashes=$((crashes + 1))
  fi
  if [[ -z "$why" && "$mode" == "bsp" ]]; then
    local sum
    sum=$(model_md5 "$dir/model")
    if [[ -z "${reference[$kind]:-}" ]]; then
      reference[$kind]="$sum"
    elif [[ "${reference[$kind]}" != "$sum" ]]; then
      why="BSP model differs from the first BSP run ($sum vs ${reference[$kind]})"
    fi
  fi
  if [[ -z "$why" ]]; then
    passed=$((passed + 1))
    echo "ok   $kind #$idx $mode ${secs}s (load $(cut -d' ' -f1 /proc/loadavg))"
    rm -rf "$dir"
  else
    failed=$((failed + 1))
    echo "FAIL $kind #$idx $mode ${secs}s: $why (log: $dir/output.log)"
    grep -E "ps_launch|error|Error|FAILED|failed" "$dir/output.log" | tail -5 |
      sed 's/^/     /'
  fi
}

modes=(bsp ssp asp)
for ((i = 0; i < N; i++)); do
  launch a9a "$i" "${modes[$((i % 3))]}" --config "$A9A_CONFIG"
done
for ((i = 0; i < M; i++)); do
  launch syn4x16 "$i" bsp --config "$SYN_CONFIG" --servers 4 --workers 16 \
    --set data.synthetic.train_rows=200000 --set data.synthetic.test_rows=20000 \
    --set training.epochs=1
done

elapsed=$(($(date +%s) - start_all))
{
  echo "soak: $N a9a launches (bsp/ssp/asp) + $M launches of 4x16 bsp synthetic"
  echo "soak: ${elapsed}s, hangs $hangs, crashes $crashes, false failovers $false_failovers"
  for k in "${!reference[@]}"; do echo "soak: BSP model md5 $k ${reference[$k]}"; done
  echo "$passed passed, $failed failed"
} | tee "$OUT/summary.txt"
[[ $failed -eq 0 ]]
