#!/usr/bin/env python3
"""Sparse logistic regression benchmark: BSP vs SSP (tau 1..16) vs ASP.

One command runs the same job through build/bin/ps_launch once per
consistency mode, then prints one table (wall time, time to a target test log
loss, final test log loss / AUC / accuracy, model non-zeros, examples/s and
each worker's share of time computing vs waiting), writes it as CSV together
with every run's test-loss curve, and draws PNG plots after the OSDI'14
parameter server paper: test log loss against time per mode, per-worker
compute vs wait bars (its Figure 10), and wait share and time-to-target
against tau (its Figure 13). With --liblinear it also trains Debian's
LIBLINEAR (`train -s 0 -c C -B 1`, `predict -b 1`) on the same data.

  python3 bench/lr_benchmark.py --data a9a --servers 2 --workers 4
  python3 bench/lr_benchmark.py --data a9a --straggler 4 --modes bsp,ssp,asp
  python3 bench/lr_benchmark.py --data criteo --liblinear --modes bsp
  python3 bench/lr_benchmark.py --quick --check-auc 0.89   # the ctest smoke

Outputs in --out (default runs/lr_benchmark/<data>): results.csv,
curves.csv, reports/<run>.json (ps_launch's report), logs/<run>.log and
lr_<label>_{logloss,workers,tau}.png. Exit status: 0 when every run
succeeded (and cleared --check-auc), 1 when a run failed, 2 for bad
arguments, 3 when --check-auc failed, 77 (skipped) when the preset's data
set is not in ../shared/data. Docs: docs/lr_benchmark.md.
"""

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SSP_TAUS = (1, 2, 4, 8, 16)

# Per data set: example config, default target test log loss (about 3% above
# the LIBLINEAR reference; see ../shared/data/README.md), evaluation interval
# for the curve, and what LIBLINEAR trains on (C from that README's grid).
DATASETS = {
    "a9a": dict(config="deploy/configs/a9a.yaml", target=0.335, eval_s=0.25,
                liblinear=dict(format="libsvm", c=0.1,
                               train="../shared/data/a9a/a9a.train",
                               test="../shared/data/a9a/a9a.test")),
    "news20": dict(config="deploy/configs/news20.yaml", target=0.175,
                   eval_s=0.5,
                   liblinear=dict(
                       format="libsvm", c=30,
                       train="../shared/data/news20-compsci/train.libsvm",
                       test="../shared/data/news20-compsci/test.libsvm")),
    "criteo": dict(config="deploy/configs/criteo.yaml", target=0.48,
                   eval_s=0.1,
                   liblinear=dict(format="criteo", c=0.03,
                                  train="../shared/data/criteo-10k/train.tsv",
                                  test="../shared/data/criteo-10k/test.tsv")),
    "synthetic": dict(config="deploy/configs/quickstart.yaml", target=None,
                      eval_s=1.0, liblinear=None),
}

# Columns of results.csv, in order. worker_* columns hold one value per
# worker (ordered by worker id) joined with ';'.
COLUMNS = [
    "data", "servers", "workers", "mode", "tau", "straggler", "status",
    "wall_seconds", "train_seconds", "target_logloss", "time_to_target_s",
    "test_logloss", "test_auc", "test_accuracy", "model_nonzeros",
    "examples", "examples_per_sec", "mean_wait_share", "max_wait_share",
    "mean_consistency_wait_share",
    "worker_compute_seconds", "worker_wait_seconds", "worker_wait_share",
    "worker_units", "worker_consistency_wait_share",
    # Push traffic (issue 10: filters and compression): bytes of keys and
    # values pushed, what the gradients were as uint64 + float32, filters.
    "push_bytes", "push_raw_bytes", "push_filters",
]
CURVE_COLUMNS = ["run", "mode", "tau", "seconds", "logloss", "auc",
                 "examples"]


def log(msg):
    print(msg, flush=True)


def parse_modes(text):
    """'bsp,ssp,asp' -> [('bsp', 0), ('ssp', 1), ..., ('asp', None)].

    ssp alone expands to every tau in SSP_TAUS; sspN, ssp:N or ssp=N is one.
    """
    runs = []
    for tok in [t.strip().lower() for t in text.split(",") if t.strip()]:
        if tok == "bsp":
            runs.append(("bsp", 0))
        elif tok == "asp":
            runs.append(("asp", None))
        elif tok == "ssp":
            runs.extend(("ssp", t) for t in SSP_TAUS)
        elif tok.startswith("ssp"):
            n = tok[3:].lstrip(":=")
            if not n.isdigit():
                raise ValueError(f"bad mode '{tok}' (bsp, asp, ssp or sspN)")
            runs.append(("ssp", int(n)))
        else:
            raise ValueError(f"bad mode '{tok}' (bsp, asp, ssp or sspN)")
    if not runs:
        raise ValueError("no modes given")
    return runs


def run_name(mode, tau):
    return f"ssp{tau}" if mode == "ssp" else mode


def tau_label(mode, tau):
    return "inf" if mode == "asp" else str(tau)


def time_to_target(report, target):
    """Seconds until worker 0's test log loss first reached `target`.

    Taken from the curve; when only the final evaluation reaches it, the end
    of worker 0's training. None when never reached.
    """
    if target is None or "test_logloss" not in report:
        return None
    for p in report.get("curve", []):
        if p["logloss"] <= target:
            return p["seconds"]
    if report["test_logloss"] <= target:
        w0 = [w for w in report.get("per_worker", []) if w["id"] == 0]
        return w0[0]["wall_seconds"] if w0 else report["train_seconds"]
    return None


def row_from_report(args, mode, tau, report, target):
    workers = sorted(report.get("per_worker", []), key=lambda w: w["id"])
    shares = [w["wait_share"] for w in workers]
    # The part of the waiting the servers held pulls for the staleness bound
    # (the rest is transfer and queueing, which ASP pays too).
    cshares = [w.get("consistency_wait_share", 0.0) for w in workers]
    t = time_to_target(report, target)
    return {
        "data": args.label, "servers": report["servers"],
        "workers": report["workers"], "mode": mode,
        "tau": tau_label(mode, tau), "straggler": args.straggler,
        "status": "ok",
        "wall_seconds": report["wall_seconds"],
        "train_seconds": report["train_seconds"],
        "target_logloss": "" if target is None else target,
        "time_to_target_s": "" if t is None else t,
        "test_logloss": report.get("test_logloss", ""),
        "test_auc": report.get("test_auc", ""),
        "test_accuracy": report.get("test_accuracy", ""),
        "model_nonzeros": report.get("model_nonzeros", ""),
        "examples": report.get("examples", ""),
        "examples_per_sec": report.get("examples_per_sec", ""),
        "push_bytes": report.get("push_bytes", ""),
        "push_raw_bytes": report.get("push_raw_bytes", ""),
        "push_filters": report.get("push_filters", ""),
        "mean_wait_share": sum(shares) / len(shares) if shares else "",
        "max_wait_share": max(shares) if shares else "",
        "mean_consistency_wait_share":
            sum(cshares) / len(cshares) if cshares else "",
        "worker_compute_seconds": ";".join(
            f"{w['compute_seconds']:.4g}" for w in workers),
        "worker_wait_seconds": ";".join(
            f"{w['wait_seconds']:.4g}" for w in workers),
        "worker_wait_share": ";".join(f"{s:.4f}" for s in shares),
        # Work units each worker finished (issue 9: a straggler takes fewer).
        "worker_units": ";".join(str(w.get("units", "")) for w in workers),
        "worker_consistency_wait_share": ";".join(
            f"{s:.4f}" for s in cshares),
    }


def launch(args, mode, tau, out):
    """Runs one job; returns (report dict or None, seconds, error text)."""
    name = run_name(mode, tau)
    report_path = out / "reports" / f"{name}.json"
    log_path = out / "logs" / f"{name}.log"
    if report_path.exists():
        report_path.unlink()
    cmd = [str(args.launcher), "--config", str(args.config),
           "--servers", str(args.servers), "--workers", str(args.workers),
           "--mode", mode]
    if mode == "ssp":
        cmd += ["--tau", str(tau)]
    sets = [f"training.eval_interval_s={args.eval_interval}",
            f"training.straggler_factor={args.straggler}",
            f"output.model_dir={out / 'models' / name}",
            f"output.log_level={args.log_level}"]
    if args.quick:
        sets.append("training.epochs=1")
    sets += args.extra_set  # last, so they win
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--report", str(report_path), "--run-dir", str(out / "runs" / name),
            "--timeout_s", str(args.timeout)]
    t0 = time.monotonic()
    with open(log_path, "w") as logf:
        logf.write(" ".join(cmd) + "\n\n")
        logf.flush()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=logf,
                                stderr=subprocess.STDOUT,
                                timeout=args.timeout + 30).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    secs = time.monotonic() - t0
    if rc != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return None, secs, f"ps_launch exit {rc} ({log_path}): " + \
            " | ".join(tail)
    try:
        return json.loads(report_path.read_text()), secs, ""
    except (OSError, ValueError) as e:
        return None, secs, f"bad report {report_path}: {e}"


# ---------------------------------------------------------------- LIBLINEAR


def criteo_to_libsvm(train_tsv, test_tsv, out_dir):
    """Writes criteo.{train,test}.libsvm: the features OpenCriteo builds.

    Integer field i with value v becomes the one-hot token (i, bucket), bucket
    = floor(ln(v)^2) for v > 2 else v; categorical field j with string s the
    token (13 + j, s). Ids come from the training split (1-based, in order of
    first appearance); test tokens not seen in training are dropped.
    """
    vocab = {}

    def convert(src, dst, grow):
        with open(src) as f, open(dst, "w") as g:
            for line in f:
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 40:
                    continue
                ids = set()
                for k, v in enumerate(fields[1:]):
                    if not v:
                        continue
                    if k < 13:
                        x = int(v)
                        v = str(math.floor(math.log(x) ** 2)) if x > 2 else v
                    tok = (k, v)
                    if tok not in vocab:
                        if not grow:
                            continue
                        vocab[tok] = len(vocab) + 1
                    ids.add(vocab[tok])
                label = "+1" if int(fields[0]) > 0 else "-1"
                g.write(label + "".join(f" {i}:1" for i in sorted(ids)) +
                        "\n")

    out_dir.mkdir(parents=True, exist_ok=True)
    train, test = out_dir / "criteo.train.libsvm", out_dir / "criteo.test.libsvm"
    convert(train_tsv, train, True)
    convert(test_tsv, test, False)
    return train, test


def auc_score(labels, scores):
    """Area under the ROC curve (ties count one half)."""
    pairs = sorted(zip(scores, labels))
    pos = sum(1 for y in labels if y)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    rank_sum, i = 0.0, 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        avg_rank = (i + 1 + j) / 2.0  # 1-based ranks i+1..j
        rank_sum += avg_rank * sum(1 for _, y in pairs[i:j] if y)
        i = j
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def find_liblinear():
    for train, predict in (("liblinear-train", "liblinear-predict"),
                           ("train", "predict")):
        t, p = shutil.which(train), shutil.which(predict)
        if t and p:
            return t, p
    return None, None


def run_liblinear(args, out):
    """Trains and evaluates LIBLINEAR L2-regularised LR; returns a row."""
    spec = DATASETS.get(args.data or "", {}).get("liblinear")
    if spec is None:
        raise RuntimeError(f"--liblinear needs --data a9a|news20|criteo")
    train_bin, predict_bin = find_liblinear()
    if train_bin is None:
        raise RuntimeError("LIBLINEAR not found: apt-get install -y "
                           "liblinear-tools")
    c = args.liblinear_c if args.liblinear_c is not None else spec["c"]
    d = out / "liblinear"
    d.mkdir(parents=True, exist_ok=True)
    train, test = ROOT / spec["train"], ROOT / spec["test"]
    t0 = time.monotonic()
    if spec["format"] == "criteo":
        train, test = criteo_to_libsvm(train, test, d)
    convert_s = time.monotonic() - t0
    model, pred = d / "model", d / "predictions"
    t0 = time.monotonic()
    subprocess.run([train_bin, "-s", "0", "-c", str(c), "-B", "1", "-q",
                    str(train), str(model)], check=True)
    train_s = time.monotonic() - t0
    subprocess.run([predict_bin, "-b", "1", str(test), str(model), str(pred)],
                   check=True, stdout=subprocess.DEVNULL)
    labels = [float(l.split()[0]) > 0 for l in open(test) if l.strip()]
    with open(pred) as f:
        header = f.readline().split()[1:]  # "labels 1 -1"
        pos_col = 1 + header.index("1") if "1" in header else \
            1 + header.index("+1")
        probs = [float(l.split()[pos_col]) for l in f if l.strip()]
    eps = 1e-15
    logloss = -sum(math.log(max(eps, p if y else 1 - p))
                   for p, y in zip(probs, labels)) / len(labels)
    acc = sum((p > 0.5) == y for p, y in zip(probs, labels)) / len(labels)
    nnz = 0
    with open(model) as f:
        in_w = False
        for line in f:
            if in_w:
                nnz += any(float(v) != 0 for v in line.split())
            elif line.strip() == "w":
                in_w = True
    row = {k: "" for k in COLUMNS}
    row.update({"data": args.label, "servers": 0, "workers": 1,
                "mode": "liblinear", "tau": f"C={c}", "straggler": 1,
                "status": "ok", "wall_seconds": train_s,
                "train_seconds": train_s, "test_logloss": logloss,
                "test_auc": auc_score(labels, probs), "test_accuracy": acc,
                "model_nonzeros": nnz,
                "target_logloss": "" if args.target is None else args.target,
                "time_to_target_s": train_s if args.target is not None and
                logloss <= args.target else ""})
    if spec["format"] == "criteo":
        log(f"  (criteo -> LIBSVM conversion took {convert_s:.2f} s, "
            f"not counted)")
    return row


# ------------------------------------------------------------------ output


def fmt(v, spec):
    if v == "" or v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def print_table(rows):
    head = ["mode", "tau", "wall_s", "t_target_s", "logloss", "auc", "acc",
            "nnz", "ex/s", "wait%", "wait% per worker", "held%",
            "held% per worker", "push MB", "of raw"]
    lines = [head]
    for r in rows:
        if r["status"] != "ok":
            lines.append([r["mode"], r["tau"], "FAILED"] + [""] * 12)
            continue
        held = r["worker_consistency_wait_share"]
        held = "/".join(f"{100 * float(s):.0f}" for s in held.split(";")) \
            if held else "-"
        per = r["worker_wait_share"]
        per = "/".join(f"{100 * float(s):.0f}" for s in per.split(";")) \
            if per else "-"
        lines.append([
            r["mode"], str(r["tau"]), fmt(r["wall_seconds"], ".2f"),
            fmt(r["time_to_target_s"], ".2f"), fmt(r["test_logloss"], ".4f"),
            fmt(r["test_auc"], ".4f"), fmt(r["test_accuracy"], ".4f"),
            fmt(r["model_nonzeros"], "d"), fmt(r["examples_per_sec"], ".0f"),
            fmt(r["mean_wait_share"] * 100 if r["mean_wait_share"] != ""
                else "", ".1f"), per,
            fmt(r["mean_consistency_wait_share"] * 100
                if r["mean_consistency_wait_share"] != "" else "", ".1f"),
            held,
            fmt(r["push_bytes"] / 1e6 if r.get("push_bytes") else "", ".2f"),
            fmt(r["push_bytes"] / r["push_raw_bytes"]
                if r.get("push_raw_bytes") else "", ".3f")])
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    for i, l in enumerate(lines):
        print("  ".join(c.rjust(w) if j not in (0, 10, 12) else c.ljust(w)
                        for j, (c, w) in enumerate(zip(l, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def write_csv(path, rows, columns):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def plot(out, label, rows, curves, target):
    """Draws lr_<label>_{logloss,workers,tau}.png; returns their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("  (no matplotlib: apt-get install -y python3-matplotlib; "
            "plots skipped)")
        return []
    ok = [r for r in rows if r["status"] == "ok" and r["mode"] != "liblinear"]
    paths = []
    dpi = 80

    # 1. Test log loss against time, one line per mode.
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in ok:
        name = run_name(r["mode"], r["tau"])
        pts = [(c["seconds"], c["logloss"]) for c in curves if c["run"] == name]
        # The final evaluation, at the end of worker 0's training.
        pts.append((r["train_seconds"], r["test_logloss"]))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                label=name if r["mode"] != "ssp" else f"ssp tau={r['tau']}")
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=0.8,
                   label=f"target {target:g}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("test log loss")
    ax.set_title(f"{label}: test log loss over time")
    lo = min([r["test_logloss"] for r in ok] + ([target] if target else []))
    ax.set_ylim(lo * 0.98, lo * 1.35)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / f"lr_{label}_logloss.png")
    fig.savefig(paths[-1], dpi=dpi)
    plt.close(fig)

    # 2. Per-worker compute vs wait (the paper's Figure 10).
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x, ticks, tick_x = 0, [], []
    for i, r in enumerate(ok):
        comp = [float(v) for v in r["worker_compute_seconds"].split(";")]
        wait = [float(v) for v in r["worker_wait_seconds"].split(";")]
        xs = list(range(x, x + len(comp)))
        ax.bar(xs, comp, color="tab:blue", label="computing" if i == 0 else None)
        ax.bar(xs, wait, bottom=comp, color="tab:orange",
               label="waiting" if i == 0 else None)
        tick_x.append(x + (len(comp) - 1) / 2)
        ticks.append(run_name(r["mode"], r["tau"]))
        x += len(comp) + 1
    ax.set_xticks(tick_x)
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_ylabel("seconds per worker")
    ax.set_title(f"{label}: each worker's time computing vs waiting")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / f"lr_{label}_workers.png")
    fig.savefig(paths[-1], dpi=dpi)
    plt.close(fig)

    # 3. Wait share and time to target against tau (the paper's Figure 13).
    taus = [r for r in ok if r["mode"] in ("bsp", "ssp", "asp")]
    if len(taus) >= 2:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        labels = [r["tau"] if r["mode"] != "asp" else "inf (asp)"
                  for r in taus]
        xs = list(range(len(taus)))
        ax.bar(xs, [100 * r["mean_wait_share"] for r in taus],
               color="tab:orange", alpha=0.7, label="wait share (mean)")
        ax.plot(xs, [100 * r["max_wait_share"] for r in taus], "v",
                color="tab:red", label="wait share (max worker)")
        ax.set_ylabel("share of time waiting (%)")
        ax.set_ylim(0, 100)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_xlabel("maximal delay tau (0 = BSP)")
        ax2 = ax.twinx()
        tt = [r["time_to_target_s"] if r["time_to_target_s"] != "" else
              float("nan") for r in taus]
        ax2.plot(xs, tt, "o-", color="tab:blue", label="time to target")
        ax2.plot(xs, [r["train_seconds"] for r in taus], "s--",
                 color="tab:green", label="training time")
        ax2.set_ylabel("seconds")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left",
                  framealpha=0.9)
        ax.set_title(f"{label}: waiting and convergence against tau")
        fig.tight_layout()
        paths.append(out / f"lr_{label}_tau.png")
        fig.savefig(paths[-1], dpi=dpi)
        plt.close(fig)
    return paths


def check_output(csv_path, bar):
    """Re-reads results.csv: every column present, every run ok, AUC >= bar."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        rows = list(reader)
    problems = []
    if missing:
        problems.append(f"missing columns {missing}")
    if not rows:
        problems.append("no rows")
    for r in rows:
        name = f"{r.get('mode')} tau={r.get('tau')}"
        try:
            auc = float(r.get("test_auc") or "nan")
        except ValueError:
            auc = float("nan")
        if r.get("status") != "ok":
            problems.append(f"{name}: {r.get('status')}")
        elif not auc >= bar:
            problems.append(f"{name}: AUC {auc} < {bar}")
    return problems


# -------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", choices=sorted(DATASETS),
                     help="data set preset (deploy/configs/<data>.yaml; "
                     "synthetic: quickstart.yaml); default a9a")
    src.add_argument("--config", help="any job config instead of a preset")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--modes", default=None,
                   help="comma list of bsp, ssp (tau 1,2,4,8,16), sspN, asp "
                   "(default bsp,ssp,asp; --quick: bsp,ssp4,asp)")
    p.add_argument("--straggler", type=float, default=1.0,
                   help="worker 0 is made this many times slower")
    p.add_argument("--target-logloss", dest="target", type=float,
                   help="target test log loss for time-to-target (default "
                   "per data set; otherwise 1.02 x the best final log loss)")
    p.add_argument("--eval-interval", type=float,
                   help="seconds between curve points (default per data set)")
    p.add_argument("--out", help="output folder (default "
                   "runs/lr_benchmark/<label>)")
    p.add_argument("--label", help="name used in plots and file names "
                   "(default the data set, +_straggler<F>)")
    p.add_argument("--extra-set", action="append", default=[],
                   metavar="SECTION.FIELD=VALUE",
                   help="passed to ps_launch as --set; repeatable")
    p.add_argument("--quick", action="store_true",
                   help="1 epoch, modes bsp,ssp4,asp (the ctest smoke test)")
    p.add_argument("--liblinear", action="store_true",
                   help="also train LIBLINEAR -s 0 on the same data")
    p.add_argument("--liblinear-c", type=float,
                   help="LIBLINEAR's C (default: the data README's best)")
    p.add_argument("--check-auc", type=float, metavar="BAR",
                   help="exit 3 unless results.csv parses, has every column "
                   "and each run's test AUC >= BAR")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--launcher", default=str(ROOT / "build/bin/ps_launch"))
    p.add_argument("--timeout", type=int, default=900,
                   help="seconds per run before ps_launch stops it")
    p.add_argument("--log-level", default="warn",
                   help="output.log_level of the jobs (logs/<run>.log)")
    args = p.parse_args(argv)
    if args.config is None and args.data is None:
        args.data = "a9a"
    preset = DATASETS.get(args.data, {}) if args.data else {}
    if args.config is None:
        args.config = preset["config"]
    args.config = Path(args.config)
    if not args.config.is_absolute():
        args.config = (Path.cwd() / args.config).resolve()
    if args.modes is None:
        args.modes = "bsp,ssp4,asp" if args.quick else "bsp,ssp,asp"
    if args.eval_interval is None:
        args.eval_interval = preset.get("eval_s", 0.5)
    if args.target is None:
        args.target = preset.get("target")
    if args.label is None:
        args.label = args.data or args.config.stem
        if args.straggler != 1.0:
            args.label += f"_straggler{args.straggler:g}"
    if args.out is None:
        args.out = ROOT / "runs" / "lr_benchmark" / args.label
    args.out = Path(args.out).resolve()
    return args


def main(argv):
    args = parse_args(argv)
    try:
        runs = parse_modes(args.modes)
    except ValueError as e:
        print(f"lr_benchmark: {e}", file=sys.stderr)
        return 2
    if not Path(args.launcher).exists():
        print(f"lr_benchmark: {args.launcher} not found; build it: cd build "
              "&& make ps_launch ps_scheduler_bin ps_server_bin "
              "ps_worker_bin", file=sys.stderr)
        return 2
    if not args.config.exists():
        print(f"lr_benchmark: no config {args.config}", file=sys.stderr)
        return 2
    spec = (DATASETS.get(args.data or "") or {}).get("liblinear")
    if spec and not (ROOT / spec["train"]).exists():
        print(f"lr_benchmark: SKIP: {ROOT / spec['train']} is missing "
              "(see ../shared/data/README.md)", file=sys.stderr)
        return 77
    out = args.out
    for sub in ("reports", "logs", "runs", "models"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    target_note = "auto" if args.target is None else f"{args.target:g}"
    log(f"lr_benchmark: {args.label}, {args.servers} servers, {args.workers} "
        f"workers, {len(runs)} runs, straggler x{args.straggler:g}, target "
        f"log loss {target_note}, output in {out}")

    rows, curves, reports = [], [], []
    failed = 0
    for i, (mode, tau) in enumerate(runs, 1):
        name = run_name(mode, tau)
        log(f"[{i}/{len(runs)}] {name}: started")
        report, secs, err = launch(args, mode, tau, out)
        if report is None:
            failed += 1
            log(f"[{i}/{len(runs)}] {name}: FAILED after {secs:.1f} s: {err}")
            row = {k: "" for k in COLUMNS}
            row.update(data=args.label, servers=args.servers,
                       workers=args.workers, mode=mode,
                       tau=tau_label(mode, tau), straggler=args.straggler,
                       status="failed")
            rows.append(row)
            continue
        reports.append((mode, tau, report))
        row = row_from_report(args, mode, tau, report, args.target)
        rows.append(row)
        for p in report.get("curve", []):
            curves.append({"run": name, "mode": mode,
                           "tau": tau_label(mode, tau), **p})
        log(f"[{i}/{len(runs)}] {name}: done in {secs:.1f} s: "
            f"train {row['train_seconds']:.2f} s, log loss "
            f"{fmt(row['test_logloss'], '.4f')}, AUC "
            f"{fmt(row['test_auc'], '.4f')}, wait "
            f"{100 * row['mean_wait_share']:.0f}% (held for consistency "
            f"{100 * row['mean_consistency_wait_share']:.1f}%), "
            f"{fmt(row['examples_per_sec'], '.0f')} examples/s")
        if args.straggler != 1.0:
            # Per worker (W0 is the straggler): wait share and work units.
            log("    wait share per worker " + ", ".join(
                f"W{i} {100 * float(s):.1f}%" for i, s in
                enumerate(row["worker_wait_share"].split(";"))) +
                "; work units " + row["worker_units"].replace(";", "/"))

    if args.target is None and reports:
        # No known reference: 2% above the best final log loss of the runs.
        best = min(r["test_logloss"] for _, _, r in reports
                   if "test_logloss" in r)
        args.target = round(best * 1.02, 4)
        for (mode, tau, rep), row in zip(
                reports, [r for r in rows if r["status"] == "ok"]):
            row.update(row_from_report(args, mode, tau, rep, args.target))
        log(f"target log loss (auto, best x 1.02): {args.target:g}")

    if args.liblinear:
        log("[liblinear] started")
        try:
            row = run_liblinear(args, out)
            rows.append(row)
            log(f"[liblinear] done: train {row['train_seconds']:.2f} s, "
                f"log loss {row['test_logloss']:.4f}, AUC "
                f"{row['test_auc']:.4f}")
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            failed += 1
            log(f"[liblinear] FAILED: {e}")

    print()
    print(f"{args.label}: {args.servers} servers, {args.workers} workers, "
          f"straggler x{args.straggler:g}, target log loss "
          f"{fmt(args.target, 'g')}")
    print_table(rows)
    csv_path = out / "results.csv"
    write_csv(csv_path, rows, COLUMNS)
    write_csv(out / "curves.csv", curves, CURVE_COLUMNS)
    print(f"\nwrote {csv_path}, {out / 'curves.csv'}")
    if not args.no_plots and reports:
        for path in plot(out, args.label, rows, curves, args.target):
            print(f"wrote {path}")

    if args.check_auc is not None:
        problems = check_output(csv_path, args.check_auc)
        if problems:
            print("check failed: " + "; ".join(problems), file=sys.stderr)
            return 3
        print(f"check passed: {csv_path} has every column, AUC >= "
              f"{args.check_auc:g} in every run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
