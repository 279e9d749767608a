#!/usr/bin/env python3
"""Draws a job's loss curves from its report (ps_launch --plot FILE).

usage: plot_report.py REPORT.json OUT.png

The training loss comes from the report's "progress" points (the workers'
mean loss over each training.progress_interval_s, every job has them); the
test log loss from its "curve" (training.eval_interval_s > 0) and its final
evaluation (test_logloss). Epoch boundaries are dotted lines. The same kind
of plot as the LR benchmark's lr_<label>_logloss.png (bench/lr_benchmark.py).

Needs matplotlib (Debian: apt-get install python3-matplotlib). Exit status:
0 when the PNG was written; 1 when the report cannot be read or holds no
point to draw; 2 for a usage error; 3 without matplotlib.
"""
import json
import sys


def fail(code, msg):
    print(f"plot_report: {msg}", file=sys.stderr)
    sys.exit(code)


def main(argv):
    if len(argv) != 3:
        fail(2, "usage: plot_report.py REPORT.json OUT.png")
    report_path, out = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(3, "needs matplotlib: apt-get install -y python3-matplotlib")
    try:
        with open(report_path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        fail(1, f"cannot read {report_path}: {e}")
    progress = report.get("progress") or []
    curve = report.get("curve") or []
    final = report.get("test_logloss")
    if not progress and not curve and final is None:
        fail(1, f"{report_path} holds no loss to draw (no progress point, "
                "no test evaluation): the job ended before its first "
                "training.progress_interval_s")

    fig, ax = plt.subplots(figsize=(7, 4))
    if progress:
        ax.plot([p["seconds"] for p in progress],
                [p["train_loss"] for p in progress], "-", color="tab:blue",
                label="training loss (mean per interval)")
        for prev, p in zip(progress, progress[1:]):
            if p["epoch"] != prev["epoch"]:
                ax.axvline(p["seconds"], color="0.8", linestyle=":",
                           linewidth=1)
    points = [(c["seconds"], c["logloss"]) for c in curve]
    if final is not None:
        points.append((report.get("train_seconds")
                       or report.get("job_seconds") or 0, final))
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-",
                color="tab:orange", markersize=3, label="test log loss")
    title = (f"{report.get('data', '?').split('/')[-1]}: "
             f"{report.get('mode', '?')}")
    if report.get("mode") == "ssp":
        title += f" tau {report.get('tau')}"
    title += (f", {report.get('servers', '?')} servers, "
              f"{report.get('workers', '?')} workers, "
              f"{report.get('optimizer', '?')}")
    if report.get("test_auc") is not None:
        title += f"; test AUC {report['test_auc']:.4f}"
    if report.get("status") != "ok":
        title += f" [{report.get('status', '?')}]"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("seconds since the cluster was ready")
    ax.set_ylabel("log loss")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as e:
        fail(1, f"cannot write {out}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
