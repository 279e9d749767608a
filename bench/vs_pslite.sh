#!/usr/bin/env bash
# vs_pslite.sh: our push/pull against ps-lite's, side by side, interleaved.
#
# A tool, not a test: the project never depends on ps-lite to build or test.
# Build ps-lite as /work/shared/peers/ps-lite.md says (commit 15b8adf plus the
# efa branch's tests/test_benchmark.cc as tests/test_benchmark_efa.cc, with
# Debian's libzmq3-dev), build our pushpull_bench, then run this on a quiet
# machine (no builds, no other benchmarks).
#
# Per workload it runs ours and ps-lite alternately, A B A B ... (--pairs
# pairs), prints the load average before each run and one line per run, then
# a table per workload: Gbit/s of values for each side, ours/ps-lite per
# pair, CPU seconds per GB (1e9 value bytes) for each side.
#
# The workloads (1 server + 1 worker on loopback):
#   dense 1 MiB push, dense 1 MiB pull, dense 4 MiB push, dense 4 MiB pull
#     ps-lite: tests/local.sh 1 1 tests/test_benchmark_efa LEN REPEAT MODE
#       (40 keys, one key of LEN bytes per request, all 40 in flight, then a
#       wait for all; its server stores the buffer and does no arithmetic).
#       Its "Application goodput: X Gbps" lines, one per LOG_DURATION rounds,
#       without the first, are combined as total bytes over total time.
#     ours: pushpull_bench --cases=bulk (a table of dim LEN/4, 40 keys, one
#       key per request, 40 in flight, the real ServerNode applying SGD).
#   sparse 100k keys push (ours only, --sparse to include)
#     ours: pushpull_bench --cases=sparse --sparse_keys=100000 with the real
#       FTRL update and 1 request in flight (as ps-lite's test waits each).
#     ps-lite is NOT run here: upstream tests/test_kv_app_benchmark pushes
#     10M keys once (hard-coded, repeat = 1). Its recorded figure (177 M
#     keys/s, no-op handler, from ps-lite.md) is printed for reference only;
#     bench/sparse_vs_pslite.sh runs a steady-state sparse test of ps-lite
#     (bench/pslite/test_sparse.cc) against ours, interleaved.
#
# CPU: ours is the benchmark's own figure (its process plus its server
# child, over the measured phase only). ps-lite's is every process of the
# run (scheduler, server, worker: the whole tree local.sh starts, via bash's
# `time`, which adds up the rusage of all waited-for descendants) over all
# the bytes it moved, start-up and the first interval included, so it
# slightly overstates ps-lite's CPU per GB. Each run's whole-tree CPU is on
# its line for both sides.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/vs_pslite.sh --pslite DIR --ours BIN_DIR [options]

  --pslite DIR      ps-lite build: DIR/tests/local.sh and
                    DIR/tests/test_benchmark_efa must exist
  --ours BIN_DIR    the folder holding our pushpull_bench (BUILD/bin)
  --pairs N         ours/ps-lite pairs per workload (default 3)
  --quick           short runs to check the script works (figures not
                    meaningful): ~1 s per run
  --seconds S       ours: measured seconds per run (default 5; --quick 1)
  --only LIST       comma list of workloads to run, of: dense1m-push,
                    dense1m-pull, dense4m-push, dense4m-pull, sparse-push
                    (default: the four dense ones, plus sparse-push with
                    --sparse)
  --sparse          also run sparse-push (ours only; see below)
  --out DIR         keep logs and results here (default: a new temp dir)
  --ours-args "..." extra flags for every pushpull_bench run
                    (--local_socket=false: ours over loopback TCP instead of
                    the servers' same-host Unix-domain sockets, the default)
  --pslite-local    ps-lite with DMLC_LOCAL=1: ZeroMQ over ipc:// (Unix-
                    domain sockets) instead of tcp://, its own same-host mode
  -h, --help        this text

Sparse: ps-lite's tests/test_kv_app_benchmark pushes 10M keys once
(hard-coded), so it cannot be made steady-state without editing it; the
script runs only ours for sparse-push and prints ps-lite's recorded figure
(177 M keys/s, ps-lite.md) beside it, marked as not measured here.

ps-lite's local.sh binds the scheduler to port 8000: it must be free.
Example (full comparison, ~10 min):
  bench/vs_pslite.sh --pslite /work/scratch/ps-lite \
      --ours /work/build-bench/bin --pairs 3 --sparse
EOF
}

die() {
  echo "vs_pslite.sh: $*" >&2
  exit 2
}

PSLITE="" OURS="" PAIRS=3 QUICK=0 SECONDS_OURS="" ONLY="" SPARSE=0 OUT=""
OURS_ARGS=""
PSLITE_LOCAL=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pslite) PSLITE="${2:?--pslite needs a folder}"; shift 2 ;;
    --ours) OURS="${2:?--ours needs a folder}"; shift 2 ;;
    --pairs) PAIRS="${2:?--pairs needs a number}"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --seconds) SECONDS_OURS="${2:?--seconds needs a number}"; shift 2 ;;
    --only) ONLY="${2:?--only needs a list}"; shift 2 ;;
    --sparse) SPARSE=1; shift ;;
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --ours-args) OURS_ARGS="${2?--ours-args needs a value}"; shift 2 ;;
    --pslite-local) PSLITE_LOCAL=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[[ -n "$PSLITE" ]] || { usage >&2; die "--pslite DIR is required"; }
[[ -n "$OURS" ]] || { usage >&2; die "--ours BIN_DIR is required"; }
[[ -d "$PSLITE" ]] || die "--pslite: no folder $PSLITE"
PSLITE="$(cd "$PSLITE" && pwd)"
[[ -x "$PSLITE/tests/local.sh" || -f "$PSLITE/tests/local.sh" ]] ||
  die "--pslite: $PSLITE/tests/local.sh missing (not a ps-lite checkout?)"
[[ -x "$PSLITE/tests/test_benchmark_efa" ]] ||
  die "--pslite: $PSLITE/tests/test_benchmark_efa missing or not executable (build it as ps-lite.md says)"
[[ -d "$OURS" ]] || die "--ours: no folder $OURS"
OURS="$(cd "$OURS" && pwd)"
BENCH="$OURS/pushpull_bench"
[[ -x "$BENCH" ]] || die "--ours: $BENCH missing or not executable (make pushpull_bench)"
[[ "$PAIRS" =~ ^[1-9][0-9]*$ ]] || die "--pairs: expected a positive number, got $PAIRS"
if [[ -z "$SECONDS_OURS" ]]; then
  if ((QUICK)); then SECONDS_OURS=1; else SECONDS_OURS=5; fi
fi
[[ "$SECONDS_OURS" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--seconds: expected a number, got $SECONDS_OURS"

ALL="dense1m-push dense1m-pull dense4m-push dense4m-pull sparse-push"
if [[ -z "$ONLY" ]]; then
  WORKLOADS="dense1m-push dense1m-pull dense4m-push dense4m-pull"
  ((SPARSE)) && WORKLOADS="$WORKLOADS sparse-push"
else
  WORKLOADS="${ONLY//,/ }"
  for w in $WORKLOADS; do
    [[ " $ALL " == *" $w "* ]] || die "--only: unknown workload $w (one of: $ALL)"
  done
fi

if [[ -z "$OUT" ]]; then
  OUT="$(mktemp -d /tmp/vs_pslite.XXXXXX)"
else
  mkdir -p "$OUT"
fi
RESULTS="$OUT/results.tsv"
: >"$RESULTS"

# ps-lite's parameters per size: LEN REPEAT LOG_DURATION (ps-lite.md: ~10 GB
# per run, 5 intervals; --quick: 3 intervals).
pslite_params() {  # $1: MiB
  case "$1:$QUICK" in
    1:0) echo "1048576 250 50" ;;
    4:0) echo "4194304 60 12" ;;
    1:1) echo "1048576 30 10" ;;
    4:1) echo "4194304 9 3" ;;
  esac
}
WARMUP=1
((QUICK)) && WARMUP=0.3
TIMEOUT=600
((QUICK)) && TIMEOUT=120

load_avg() { cut -d' ' -f1-3 /proc/loadavg; }

# calc EXPR: floating-point arithmetic (awk, no bc needed).
calc() { awk "BEGIN { printf \"%.6g\", $1 }"; }

# Runs "$@" under bash's `time` (the whole process tree's CPU), stdout and
# stderr to $1. Prints "wall user sys" and returns the command's status.
timed() {
  local log="$1"
  shift
  local TIMEFORMAT="%R %U %S" rc=0
  { time "$@" >"$log" 2>&1; } 2>"$log.time" || rc=$?
  cat "$log.time"
  return "$rc"
}

# One of ours. $1 workload, $2 pair. Appends to $RESULTS.
run_ours() {
  local w="$1" pair="$2" log="$OUT/$1.ours.$2.log" csv="$OUT/$1.ours.$2.csv"
  local args=(--topologies=1x1 --iperf=false --seconds="$SECONDS_OURS"
    --warmup_seconds="$WARMUP" --csv="$csv")
  case "$w" in
    dense1m-*) args+=(--cases=bulk --bulk_mib=1) ;;
    dense4m-*) args+=(--cases=bulk --bulk_mib=4) ;;
    sparse-*) args+=(--cases=sparse --sparse_keys=100000 --optimizer=ftrl
      --inflight=1) ;;
  esac
  args+=(--ops="${w##*-}")
  # shellcheck disable=SC2206  # word splitting of --ours-args is intended
  [[ -n "$OURS_ARGS" ]] && args+=($OURS_ARGS)
  local before
  before="$(load_avg)"
  echo "  load $before  ours    $w pair $pair: ${BENCH##*/} ${args[*]}"
  local t wall user sys
  if ! t="$(timed "$log" timeout -k 5 "$TIMEOUT" "$BENCH" "${args[@]}")"; then
    echo "ours failed ($w pair $pair); its log, $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  # The one data row of the CSV: topology,case,op,size,gbit_s,cpu_s_per_gb,
  # mkeys_s,p50_us,p99_us.
  local row
  row="$(sed -n 2p "$csv")"
  [[ -n "$row" ]] || { echo "ours wrote no row to $csv" >&2; exit 1; }
  local gbit cpu mkeys
  IFS=, read -r _ _ _ _ gbit cpu mkeys _ _ <<<"$row"
  read -r wall user sys <<<"$t"
  printf '%s\tours\t%s\t%s\t%s\t%s\t%s\n' "$w" "$pair" "$gbit" "$cpu" \
    "$mkeys" "${before%% *}" >>"$RESULTS"
  printf '    -> %.3f Gbit/s, %.3f CPU s/GB (measured phase), %.3g M keys/s; whole run %.1f s wall, %.2f s CPU\n' \
    "$gbit" "$cpu" "$mkeys" "$wall" "$(calc "$user + $sys")"
}

# One of ps-lite's. $1 workload, $2 pair. Appends to $RESULTS.
run_pslite() {
  local w="$1" pair="$2" log="$OUT/$1.pslite.$2.log"
  local mib mode len repeat dur
  case "$w" in
    dense1m-*) mib=1 ;;
    dense4m-*) mib=4 ;;
    *) return 0 ;;
  esac
  case "$w" in
    *-push) mode=2 ;;
    *-pull) mode=3 ;;
  esac
  read -r len repeat dur <<<"$(pslite_params "$mib")"
  if (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null; then
    die "port 8000 (ps-lite's scheduler, fixed in local.sh) is in use"
  fi
  local before
  before="$(load_avg)"
  echo "  load $before  ps-lite $w pair $pair: LOG_DURATION=$dur tests/local.sh 1 1 tests/test_benchmark_efa $len $repeat $mode"
  local t wall user sys
  if ! t="$(cd "$PSLITE" && DMLC_NODE_HOST=127.0.0.1 \
    DMLC_PS_ROOT_URI=127.0.0.1 LOG_DURATION="$dur" DMLC_LOCAL="$PSLITE_LOCAL" \
    timed "$log" timeout -k 5 "$TIMEOUT" bash tests/local.sh 1 1 \
    tests/test_benchmark_efa "$len" "$repeat" "$mode")"; then
    echo "ps-lite failed ($w pair $pair); its log, $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  read -r wall user sys <<<"$t"
  # Intervals of equal bytes: total bytes over total time is the harmonic
  # mean of the rates, first interval dropped.
  local gbit
  gbit="$(grep -o 'Application goodput: [0-9.eE+-]*' "$log" |
    awk '{ g[NR] = $3 } END {
      if (NR < 2) exit 1
      for (i = 2; i <= NR; i++) s += 1 / g[i]
      printf "%.4f", (NR - 1) / s }')" ||
    { echo "ps-lite printed fewer than 2 goodput lines; $log:" >&2
      tail -20 "$log" >&2; exit 1; }
  # Bytes moved: the initial push of the 40 keys, then REPEAT rounds.
  local cpu
  cpu="$(calc "($user + $sys) / (($repeat + 1) * 40 * $len / 1e9)")"
  printf '%s\tpslite\t%s\t%s\t%s\t\t%s\n' "$w" "$pair" "$gbit" "$cpu" \
    "${before%% *}" >>"$RESULTS"
  printf '    -> %.3f Gbit/s (%d intervals after the first), %.3f CPU s/GB (whole tree, whole run); %.1f s wall, %.2f s CPU\n' \
    "$gbit" "$(($(grep -c 'Application goodput' "$log") - 1))" "$cpu" "$wall" \
    "$(calc "$user + $sys")"
}

command -v timeout >/dev/null || die "timeout (coreutils) is needed"

echo "vs_pslite: ours $BENCH, ps-lite $PSLITE, $PAIRS pair(s), quick=$QUICK, logs in $OUT"
echo "machine: $(nproc) cores, $(uname -r); load before start $(load_avg)"
for w in $WORKLOADS; do
  echo "== $w"
  for ((p = 1; p <= PAIRS; p++)); do
    run_ours "$w" "$p"
    run_pslite "$w" "$p"
  done
done

echo
echo "== results (Gbit/s of values; CPU s per 1e9 value bytes, all processes; load = 1-min average before the run)"
awk -F'\t' '
  function label(w) {
    if (w == "sparse-push") return "sparse 100k keys push (M keys/s)"
    split(w, parts, "-"); sub("m", " MiB", parts[1]); sub("dense", "dense ", parts[1])
    return parts[1] " " parts[2]
  }
  { order[$1] = order[$1] ? order[$1] : ++n; names[order[$1]] = $1
    key = $1 SUBSEP $3
    if ($2 == "ours") { og[key] = $4; oc[key] = $5; ok[key] = $6; ol[key] = $7 }
    else { pg[key] = $4; pc[key] = $5; pl[key] = $7 }
    if ($3 > pairs) pairs = $3 }
  END {
    for (i = 1; i <= n; i++) {
      w = names[i]; printf "\n%s\n", label(w)
      if (w == "sparse-push") {
        printf "  %-5s %12s %10s %14s %6s %9s\n", "run", "ours Mkeys/s", "ours Gb/s", "ours CPU s/GB", "load", "x 177"
        for (p = 1; p <= pairs; p++) { k = w SUBSEP p; if (!(k in og)) continue
          printf "  %-5s %12.2f %10.3f %14.3f %6s %9.3f\n", p, ok[k], og[k], oc[k], ol[k], ok[k] / 177 }
        printf "  ps-lite: not run (see --help); recorded 177 M keys/s (no-op handler, loaded machine, ps-lite.md)\n"
        continue
      }
      printf "  %-5s %10s %12s %8s %14s %17s %6s %6s\n", "pair", "ours Gb/s", "ps-lite Gb/s", "ratio", "ours CPU s/GB", "ps-lite CPU s/GB", "load A", "load B"
      m = 0; delete rs
      for (p = 1; p <= pairs; p++) { k = w SUBSEP p; if (!(k in og) || !(k in pg)) continue
        ratio = pg[k] > 0 ? og[k] / pg[k] : 0; rs[++m] = ratio
        printf "  %-5s %10.3f %12.3f %8.3f %14.3f %17.3f %6s %6s\n", p, og[k], pg[k], ratio, oc[k], pc[k], ol[k], pl[k] }
      # median of the per-pair ratios
      for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (rs[y] < rs[x]) { t = rs[x]; rs[x] = rs[y]; rs[y] = t }
      if (m > 0) printf "  median ratio ours/ps-lite over %d pair(s): %.3f\n", m, (m % 2) ? rs[(m + 1) / 2] : (rs[m / 2] + rs[m / 2 + 1]) / 2
    }
  }' "$RESULTS"
echo
echo "raw results: $RESULTS; logs: $OUT"
