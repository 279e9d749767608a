#!/bin/bash
# The cost of distribution (issue 10, docs/benchmarks.md): one run of the
# scale.yaml job, shortened to ROWS training rows, either distributed
# (ps_launch: 2 servers + 4 workers over loopback) or in one process
# (inproc_train), under /usr/bin/time. Prints the load average, user and
# system CPU seconds, wall seconds, the bytes that crossed loopback
# (/proc/net/dev, so run nothing else meanwhile), examples per CPU-second and
# the test AUC. Compare modes in interleaved pairs, with the same overrides
# on both sides (the in-process run builds the same cluster: scale.yaml's two
# servers get the default replica there too, so an in-process run without
# fault_tolerance.replicas=0 replicates; before 2026-12-07 the figures of
# docs/benchmarks.md compared it with an unreplicated distributed run):
#   for i in 1 2 3; do bench/dist_vs_local.sh local fault_tolerance.replicas=0
#     bench/dist_vs_local.sh dist fault_tolerance.replicas=0; done
# Extra arguments are config overrides: bench/dist_vs_local.sh dist fault_tolerance.replicas=0
# BIN (default build/bin) names the binaries' folder; ROWS defaults to 3000000.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: bench/dist_vs_local.sh dist|local [key=value ...]}
shift
bin=${BIN:-build/bin}
rows=${ROWS:-3000000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set "data.synthetic.train_rows=$rows" --set data.synthetic.test_rows=100000
      --set "output.model_dir=$out/model")
for s in "$@"; do sets+=(--set "$s"); done
# inproc_train takes one --set with comma-separated overrides.
joined=$(IFS=,; echo "data.synthetic.train_rows=$rows,data.synthetic.test_rows=100000,output.model_dir=$out/model${*:+,$*}")
case "$mode" in
  dist) cmd=("$bin/ps_launch" --config deploy/configs/scale.yaml "${sets[@]}") ;;
  local) cmd=("$bin/inproc_train" --config deploy/configs/scale.yaml --set "$joined") ;;
  *) echo "mode must be dist or local, got $mode" >&2; exit 2 ;;
esac
load=$(cut -d' ' -f1 /proc/loadavg)
lo() { awk '$1 == "lo:" { print $2 }' /proc/net/dev; }
before=$(lo)
/usr/bin/time -f "%U %S %e" -o "$out/time" "${cmd[@]}" --report "$out/report.json" \
  > "$out/log" 2>&1 || { tail -20 "$out/log" >&2; exit 1; }
after=$(lo)
python3 - "$mode" "$load" "$out/time" "$out/report.json" "$((after - before))" <<'PY'
import json, sys
mode, load, tfile, rfile, lo_bytes = sys.argv[1:]
user, sys_s, wall = map(float, open(tfile).read().split()[-3:])
r = json.load(open(rfile))
cpu = user + sys_s
print(f"{mode:5} load {load} user {user:.1f} sys {sys_s:.1f} cpu {cpu:.1f} wall {wall:.1f} "
      f"loopback_MB {int(lo_bytes) / 1e6:.0f} examples_per_cpu_s {r['examples'] / cpu:.0f} "
      f"status {r['status']} test_auc {r.get('test_auc', 0):.4f}")
PY
# Each server's replication counts (info log), to stderr: what a setting
# did to the number of batches and rows, which the CPU figures are too noisy
# on these machines to show alone.
grep -ho "S\[[0-9]*\] .*replicated [0-9]* entries in .*" "$out/log" >&2 || true
