#!/usr/bin/env bash
# Quick start (1): install, build, and train sparse logistic regression on
# the built-in synthetic data with a local cluster of processes
# (1 scheduler + 2 servers + 2 workers, bounded delay tau=4).
# Extra arguments go to ps_launch (e.g. --mode bsp, --set training.epochs=3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/deploy/build.sh" --target ps_launch ps_scheduler_bin ps_server_bin \
  ps_worker_bin ps_status
mkdir -p runs
REPORT="runs/quickstart-report.json"
build/bin/ps_launch --config deploy/configs/quickstart.yaml \
  --report "$REPORT" "$@"
python3 - "$REPORT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print()
print(f"mode {r['mode']} tau {r['tau']}, {r['servers']} servers, {r['workers']} workers, "
      f"{r['examples']} examples in {r['train_seconds']:.1f} s ({r['examples_per_sec']:.0f} examples/s)")
print(f"test AUC {r['test_auc']:.4f}  log loss {r['test_logloss']:.4f}  accuracy {r['test_accuracy']:.4f}")
for w in r["per_worker"]:
    print(f"  W[{w['id']}]: compute {w['compute_seconds']:.2f} s, waiting {w['wait_seconds']:.2f} s ({100*w['wait_share']:.0f}% waiting)")
print(f"model: {r['model_nonzeros']} non-zero weights of {r['model_keys']} keys, written to {r['model_dir']}/ "
      f"({', '.join(r['model_files'])}; .txt exports beside them)")
print(f"report: {sys.argv[1]}")
PY
