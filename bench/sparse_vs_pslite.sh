#!/usr/bin/env bash
# sparse_vs_pslite.sh: the sparse push and pull (100k random keys of a dim-1
# table per request, 1 server + 1 worker on loopback, 4 in flight) of ours and
# of ps-lite, interleaved round by round, the load average before each run.
#
# A tool, not a test: the project never depends on ps-lite. Build ps-lite as
# /work/shared/peers/ps-lite.md says and add bench/pslite/test_sparse.cc to it
# as tests/test_sparse (its server answers without storing anything: the
# no-op reference the issue names). Run on a quiet machine.
#
#   bench/sparse_vs_pslite.sh --pslite DIR [--ours build/bin] [--rounds 3]
#       [--keys 100000] [--seconds 3] [--dense_ids 1000000]
#       [--ours-args "--local_socket=false"] [--pslite-local]
#
# --ours-args: extra flags for every pushpull_bench run (--local_socket=false:
# loopback TCP instead of the servers' same-host sockets, the default).
# --pslite-local: ps-lite with DMLC_LOCAL=1 (ZeroMQ over ipc://, its
# same-host mode) instead of tcp://.
#
# Per round: ours with the keys sent (FTRL), ours with key caching, ours with
# key caching and each key list a KeySet (--key_sets: the worker cuts and
# compares it once, not per request), ours with
# the keys of random feature ids below --dense_ids in the dense-id layout
# (the LR jobs' keys and default; 0 skips it), ps-lite push, ps-lite pull. Ours prints M keys/s and the CPU ns per key of all its
# processes; ps-lite prints M keys/s.
set -euo pipefail

pslite="" ours="build/bin" rounds=3 keys=100000 seconds=3 dense_ids=1000000
ours_args="" pslite_local=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pslite) pslite="$2"; shift 2 ;;
    --ours) ours="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --keys) keys="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --dense_ids) dense_ids="$2"; shift 2 ;;
    --ours-args) ours_args="$2"; shift 2 ;;
    --pslite-local) pslite_local=1; shift ;;
    *) echo "sparse_vs_pslite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$pslite" || ! -x "$pslite/tests/test_sparse" ]]; then
  echo "sparse_vs_pslite.sh: --pslite DIR must hold a built tests/test_sparse" >&2
  exit 2
fi
if [[ ! -x "$ours/pushpull_bench" ]]; then
  echo "sparse_vs_pslite.sh: no $ours/pushpull_bench (build it first)" >&2
  exit 2
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
run_ours() {  # extra flags...
  echo "  load $(load)"
  "$ours/pushpull_bench" --cases=sparse --topologies=1x1 \
    --sparse_keys="$keys" --optimizer=ftrl --seconds="$seconds" \
    --warmup_seconds=1 --iperf=false $ours_args "$@" 2>&1 |
    awk '/^1S1W/ && ($3 == "push" || $3 == "pull") {printf "  ours %s %s: %s M keys/s, %s CPU ns/key\n", $2, $3, $6, $13}'
}
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r"
  run_ours
  run_ours --key_caching
  run_ours --key_caching --key_sets
  if [[ "$dense_ids" != 0 ]]; then run_ours --sparse_dense_ids="$dense_ids"; fi
  for mode in 0 1; do
    echo "  load $(load)"
    (cd "$pslite" && DMLC_NODE_HOST=127.0.0.1 DMLC_PS_ROOT_URI=127.0.0.1 \
      DMLC_LOCAL="$pslite_local" \
      timeout 120 tests/local.sh 1 1 tests/test_sparse "$keys" "$mode" \
      "$seconds" 4 2>&1 | grep -i "keys/s" | sed "s/^/  ps-lite: /")
  done
done
