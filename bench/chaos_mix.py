#!/usr/bin/env python3
"""Random mixes of every kind of membership change, on real processes
(issue 9; docs/fault_tolerance.md, "Stop 54").

  python3 bench/chaos_mix.py --seeds 1-40 [--modes bsp,asp,ssp]

For each seed, draws 3 to 6 `ps_launch` chaos events at random points of
the job (eEPOCHS, between 0.5 and 7 epochs of work done): add a server or a
worker, SIGKILL a worker, a server or the scheduler, drain a server, stop
(SIGSTOP) a server for 2 s or a worker for 1 s; each server is the target of
at most one kill, drain or stop; killed processes are replaced 0.2 s later
(`--restart=0.2`). Then it runs the a9a job (3 servers, 2 workers, 1
replica, --epochs, 2 s heartbeat timeout) once per mode with those events,
and prints one line per launch: the events, the exit status, and the
report's status, test AUC and error. The same seed draws the same events
(Python's random.Random(seed)).

A launch passes when it ends ok with 32561 examples in every epoch, a
test AUC within 0.002 of a run without events (--clean-auc, measured first
when not given) and no more workers declared dead than were killed (a
paused worker must not be), or is excused: it lost two or more servers
(killed, or stopped until declared dead) and failed with the data loss one
replica cannot avoid (every holder of a range dead
before the refill's copy: "every backup with a complete copy are dead").
Exit status 1 when any launch does neither.

Options: --data DIR (default ../shared/data/a9a), --bin DIR (build/bin),
--out DIR (runs/chaos_mix: each launch's job.yaml, launch.log and
report.json), --epochs N (10), --set FIELD=VALUE (every launch; repeatable).
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys

import a9a_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Data loss one replica cannot avoid: every holder of a range killed before
# the refill's copy (the events kill two or more servers).
EXCUSED = "every backup with a complete copy are dead"


def draw(seed):
    """The chaos flags of `seed`."""
    rng = random.Random(seed)
    events = []
    used = set()  # servers already killed, drained or stopped
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(["S+", "W+", "kW", "kS", "kH", "dS", "pW", "pS"])
        at = round(rng.uniform(0.5, 7), 1)
        if kind == "S+":
            events.append("--add-server e%s" % at)
        elif kind == "W+":
            events.append("--add-worker e%s" % at)
        elif kind == "kW":
            events.append("--kill W%d@e%s" % (rng.randint(0, 1), at))
        elif kind == "kH":
            events.append("--kill H@e%s" % at)
        elif kind == "pW":
            events.append("--pause W%d@e%s:1" % (rng.randint(0, 1), at))
        else:
            free = [s for s in range(3) if s not in used]
            if not free:
                continue
            s = rng.choice(free)
            used.add(s)
            if kind == "kS":
                events.append("--kill S%d@e%s" % (s, at))
            elif kind == "dS":
                events.append("--drain S%d@e%s" % (s, at))
            else:
                events.append("--pause S%d@e%s:2" % (s, at))
    return events + ["--restart=0.2"]


def launch(args, name, mode, flags):
    """Runs one job; returns (exit status, report dict or None)."""
    d = os.path.join(args.out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # Heartbeats faster than the default, so that a pause is noticed.
    sets = ["cluster.heartbeat_ms=500", "cluster.heartbeat_timeout_ms=2000",
            "fault_tolerance.replicas=1"] + list(args.set)
    cmd, report = a9a_job.prepare(d, args.bin, 3, 2, mode,
                                  0 if mode == "bsp" else 2, args.data,
                                  args.epochs, sets)
    cmd += " ".join(flags).split()
    with open(os.path.join(d, "launch.log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        with open(report) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return rc, None
    # The workers the launcher SIGKILLed (its log's "chaos: killed W[..."
    # lines): a report naming more dead workers declared a live one dead.
    # And the servers declared dead while stopped (a pause as long as the
    # heartbeat timeout is a failure as a kill is: its ranges go to their
    # backups, and its copy falls behind).
    with open(os.path.join(d, "launch.log"), errors="replace") as log:
        lines = log.readlines()
    got["_workers_killed"] = sum(
        1 for line in lines if "ps_launch: chaos: killed W[" in line)
    got["_servers_declared_dead"] = sorted(set(
        int(m.group(1)) for line in lines
        for m in [re.search(r"S\[(\d+)\] was declared dead", line)] if m))
    return rc, got


def verdict(rc, report, clean_auc, epochs, flags):
    """'ok', 'excused' or 'FAILED: why'."""
    if report is None:
        return "FAILED: no report (exit %d)" % rc
    if rc == 0 and report.get("status") == "ok":
        counts = report.get("epoch_examples", [])
        if len(counts) != epochs or any(n != 32561 for n in counts):
            return "FAILED: epoch counts %s" % counts
        auc = report.get("test_auc", 0)
        if clean_auc is not None and abs(auc - clean_auc) > 0.002:
            return "FAILED: AUC %.4f against %.4f" % (auc, clean_auc)
        dead = report.get("dead_workers", [])
        if len(dead) > report.get("_workers_killed", 0):
            return "FAILED: workers declared dead %s, %d killed" % (
                dead, report.get("_workers_killed", 0))
        return "ok"
    server_kills = sum(1 for f in flags if f.startswith("--kill S"))
    paused = set(int(f.split("@")[0][len("--pause S"):]) for f in flags
                 if f.startswith("--pause S"))
    failed_paused = len(paused & set(report.get("_servers_declared_dead", [])))
    if EXCUSED in report.get("error", "") and server_kills + failed_paused >= 2:
        return "excused"
    return "FAILED: exit %d, %s" % (rc, report.get("error", ""))


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", required=True,
                   help="FIRST-LAST, or a comma list of seeds")
    p.add_argument("--modes", default="bsp,asp,ssp")
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "a9a"))
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "chaos_mix"))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--clean-auc", type=float, default=None)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    if "," in args.seeds:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    else:
        first, _, last = args.seeds.partition("-")
        seeds = range(int(first), int(last or first) + 1)
    modes = [m for m in args.modes.split(",") if m]
    if not os.path.exists(os.path.join(args.data, "a9a.train")):
        print("missing %s/a9a.train" % args.data, file=sys.stderr)
        return 2
    clean = {}
    for mode in modes:
        if args.clean_auc is not None:
            clean[mode] = args.clean_auc
            continue
        rc, report = launch(args, "clean_" + mode, mode, [])
        if rc != 0 or report is None:
            print("the clean %s run failed (exit %d)" % (mode, rc))
            return 1
        clean[mode] = report["test_auc"]
        print("clean %s: AUC %.4f" % (mode, clean[mode]), flush=True)
    tally = {}
    for seed in seeds:
        flags = draw(seed)
        for mode in modes:
            rc, report = launch(args, "s%d_%s" % (seed, mode), mode, flags)
            v = verdict(rc, report, clean[mode], args.epochs, flags)
            key = v.split(":")[0]
            tally[key] = tally.get(key, 0) + 1
            auc = report.get("test_auc") if report else None
            print("seed %d %s: %s | %s%s" % (
                seed, mode, " ".join(flags), v,
                "" if auc is None or v != "ok" else " (AUC %.4f)" % auc),
                flush=True)
    print("launches: %s" % ", ".join("%d %s" % (n, k) for k, n in sorted(tally.items())))
    return 1 if any(k.startswith("FAILED") for k in tally) else 0


if __name__ == "__main__":
    sys.exit(main())
