#!/usr/bin/env python3
"""Fault-tolerance benchmarks (issue 9), on real processes through ps_launch.

  python3 bench/failover_bench.py recovery [--runs 20] [--mode asp]
      SIGKILLs one of three servers (`ps_launch --kill S1@AT`) in --runs
      launches of the a9a job (1 replica) and prints, per launch, the
      failover the scheduler reports (detect_ms: last heartbeat to the
      verdict; recovery_ms: last heartbeat to the first push acknowledged
      under the new epoch; from_kill_ms: the launcher's kill to that ack),
      then their distribution. Every launch must end ok with exact epoch
      counts.

  python3 bench/failover_bench.py cost [--pairs 5] [--mode asp]
      The cost of replication: the same job with fault_tolerance.replicas
      0 and 1, interleaved (0 1 0 1 ...), printing per launch the job's
      wall seconds, the CPU seconds of all its processes (user + sys of
      ps_launch's children) and examples/s, then the medians and ratios.

  python3 bench/failover_bench.py elastic [--pairs 5] [--mode asp]
      Elasticity: the same job plain and with `ps_launch --add-server AT
      --drain S1@AT2` (a fourth server joins, then S[1] is drained),
      interleaved; prints per launch the job's wall and CPU seconds and,
      for the elastic one, each join/drain the report lists (ranges moved,
      seconds from the request to the switch), then medians and the
      job-time ratio. Every launch must end ok with exact epoch counts.

Common options: --set FIELD=VALUE (every launch; repeatable), --data DIR (default ../shared/data/a9a), --servers 3,
--workers 2, --epochs, --bin build/bin, --out runs/failover_bench. The load
average is printed beside every figure. Results go to stdout; keep them in
docs/fault_tolerance.md with the command. Exit status 1 when a launch fails.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

import a9a_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    return "load %.2f" % os.getloadavg()[0]


def _spin_cpu(n, cpu, q):
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    t0 = time.process_time()
    x = 1
    for _ in range(n):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
    q.put(time.process_time() - t0)


def machine_probe(n=3_000_000):
    """The speed of each vCPU now, alone and with the other one busy.

    Seconds of CPU for the same loop pinned to CPU 0 alone, CPU 1 alone, and
    on both at once. On the 2-vCPU machines these benchmarks run on, both
    were seen within an hour (2026-11-27): two busy vCPUs sharing one core's
    throughput (each copy's CPU time doubled when run together), and CPU 0
    1.3-1.7x slower than CPU 1 for memory-bound work while they ran in
    parallel. CPU seconds of a job then depend on where and how much its
    processes overlap: compare figures taken back to back, read beside this.
    """
    import multiprocessing
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        return "probe needs 2 CPUs"
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    q = multiprocessing.Queue()

    def run(which):
        ps = [multiprocessing.Process(target=_spin_cpu, args=(n, c, q))
              for c in which]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        return sorted(q.get() for _ in ps)

    a0, a1, both = run([c0]), run([c1]), run([c0, c1])
    return ("spin s: cpu%d %.2f, cpu%d %.2f alone; %.2f / %.2f together" %
            (c0, a0[0], c1, a1[0], both[0], both[1]))


def launch(args, name, sets, extra):
    """Runs one ps_launch; returns (report dict or None, wall s, cpu s, log)."""
    d = os.path.join(args.out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd, report = a9a_job.prepare(d, args.bin, args.servers, args.workers,
                                  args.mode, args.tau, args.data, args.epochs,
                                  list(args.set) + list(sets))
    cmd += extra
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(os.path.join(d, "launch.log"), "w") as f:
        f.write(p.stdout)
    if p.returncode != 0 or not os.path.exists(report):
        print("%s: ps_launch exited %d; log in %s" % (name, p.returncode, d))
        return None, wall, cpu, p.stdout
    with open(report) as f:
        r = json.load(f)
    if r.get("status") != "ok":
        print("%s: status %s: %s" % (name, r.get("status"), r.get("error")))
        return None, wall, cpu, p.stdout
    return r, wall, cpu, p.stdout


def kill_unix_ms(log):
    for line in log.splitlines():
        if "chaos: killed S[" in line and "unix ms " in line:
            return int(line.rsplit("unix ms ", 1)[1].split()[0])
    return None


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def recovery(args):
    rec, det, from_kill = [], [], []
    ok = True
    for i in range(args.runs):
        r, wall, _, log = launch(args, "kill-%d" % i,
                                 ["fault_tolerance.replicas=1"],
                                 ["--kill", "S1@%s" % args.at])
        if r is None:
            ok = False
            continue
        fo = r.get("failovers", [])
        examples = r.get("epoch_examples", [])
        if not fo or fo[0].get("recovery_ms") is None:
            print("run %d: no failover with recovery_ms in the report" % i)
            ok = False
            continue
        if len(set(examples)) != 1:
            print("run %d: epoch example counts differ: %s" % (i, examples))
            ok = False
        f = fo[0]
        k = kill_unix_ms(log)
        fk = f["first_ack_unix_ms"] - k if k is not None else float("nan")
        rec.append(f["recovery_ms"])
        det.append(f["detect_ms"])
        from_kill.append(fk)
        print("run %2d: %s detect_ms %4d recovery_ms %4d from_kill_ms %4d "
              "auc %.4f wall %.1f s (%s)" % (i, f["node"], f["detect_ms"],
                                             f["recovery_ms"], fk,
                                             r["test_auc"], wall, load()),
              flush=True)
    if rec:
        for name, xs in (("detect_ms", det), ("recovery_ms", rec),
                         ("from_kill_ms", from_kill)):
            print("%-13s n=%d min %d median %d p90 %d max %d" %
                  (name, len(xs), min(xs), statistics.median(xs),
                   pct(xs, 0.9), max(xs)))
    return ok


def cost(args):
    rows = {0: [], 1: []}
    ok = True
    for i in range(args.pairs):
        for rep in (0, 1):
            r, wall, cpu, _ = launch(args, "cost-%d-r%d" % (i, rep),
                                     ["fault_tolerance.replicas=%d" % rep], [])
            if r is None:
                ok = False
                continue
            ex = sum(r["epoch_examples"])
            rows[rep].append((r["job_seconds"], cpu, ex))
            print("pair %d replicas %d: job %.2f s, %.0f examples/s, cpu %.2f s "
                  "(%.1f us/example), auc %.4f (%s)" %
                  (i, rep, r["job_seconds"], ex / r["job_seconds"], cpu,
                   1e6 * cpu / ex, r["test_auc"], load()), flush=True)
    if rows[0] and rows[1]:
        m = {rep: (statistics.median(x[0] for x in rows[rep]),
                   statistics.median(x[1] for x in rows[rep]))
             for rep in (0, 1)}
        for rep in (0, 1):
            print("replicas %d: median job %.2f s, median cpu %.2f s" %
                  (rep, m[rep][0], m[rep][1]))
        print("replication cost: %.2fx wall, %.2fx cpu" %
              (m[1][0] / m[0][0], m[1][1] / m[0][1]))
        # Pairs run back to back see the same load: the median of the
        # per-pair ratios is steadier than the ratio of the medians.
        n = min(len(rows[0]), len(rows[1]))
        if n == args.pairs:
            walls = [rows[1][i][0] / rows[0][i][0] for i in range(n)]
            cpus = [rows[1][i][1] / rows[0][i][1] for i in range(n)]
            print("per pair: wall %s, cpu %s" %
                  (" ".join("%.2f" % x for x in walls),
                   " ".join("%.2f" % x for x in cpus)))
            print("median of the per-pair ratios: %.2fx wall, %.2fx cpu" %
                  (statistics.median(walls), statistics.median(cpus)))
    return ok


def elastic(args):
    rows = {"plain": [], "elastic": []}
    moves = {"joined": [], "drained": []}
    ok = True
    for i in range(args.pairs):
        for kind in ("plain", "elastic"):
            extra = [] if kind == "plain" else [
                "--add-server", args.at,
                "--drain", "S1@%s" % args.at2]
            r, wall, cpu, _ = launch(args, "elastic-%d-%s" % (i, kind),
                                     ["fault_tolerance.replicas=1"], extra)
            if r is None:
                ok = False
                continue
            examples = r.get("epoch_examples", [])
            if len(set(examples)) != 1:
                print("pair %d %s: epoch example counts differ: %s" %
                      (i, kind, examples))
                ok = False
            line = ""
            if kind == "elastic":
                got = {m["event"]: m for m in r.get("membership", [])}
                for ev in ("joined", "drained"):
                    m = got.get(ev)
                    if m is None or m.get("error"):
                        print("pair %d: no successful %s in the report: %s" %
                              (i, ev, r.get("membership")))
                        ok = False
                        continue
                    moves[ev].append(m["seconds"])
                    line += " %s %s: %d ranges in %.0f ms;" % (
                        ev, m["node"], m["ranges"], 1e3 * m["seconds"])
            rows[kind].append((r["job_seconds"], cpu))
            print("pair %d %-7s job %.2f s, cpu %.2f s, auc %.4f;%s (%s)" %
                  (i, kind, r["job_seconds"], cpu, r["test_auc"], line,
                   load()), flush=True)
    for ev, xs in moves.items():
        if xs:
            print("%s: n=%d min %.0f ms median %.0f ms max %.0f ms" %
                  (ev, len(xs), 1e3 * min(xs), 1e3 * statistics.median(xs),
                   1e3 * max(xs)))
    if rows["plain"] and rows["elastic"]:
        m = {k: (statistics.median(x[0] for x in v),
                 statistics.median(x[1] for x in v)) for k, v in rows.items()}
        for k in ("plain", "elastic"):
            print("%s: median job %.2f s, median cpu %.2f s" %
                  (k, m[k][0], m[k][1]))
        print("elastic / plain: %.2fx wall, %.2fx cpu" %
              (m["elastic"][0] / m["plain"][0],
               m["elastic"][1] / m["plain"][1]))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["recovery", "cost", "elastic"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--mode", default="asp", choices=["bsp", "ssp", "asp"])
    ap.add_argument("--tau", type=int, default=2)
    ap.add_argument("--at", default="e2",
                    help="seconds after the cluster is ready, or eEPOCHS "
                    "(e2: once two epochs of work are done; the default, the "
                    "same point of the job on any machine) (--kill S1@AT; "
                    "elastic: --add-server AT)")
    ap.add_argument("--at2", default="e4",
                    help="elastic: --drain S1@AT2")
    ap.add_argument("--set", action="append", default=[],
                    help="FIELD=VALUE for every launch (repeatable)")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared",
                                                   "data", "a9a"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs",
                                                  "failover_bench"))
    args = ap.parse_args()
    args.data = os.path.abspath(args.data)
    if args.mode != "ssp":
        args.tau = 0
    if not os.path.exists(os.path.join(args.data, "a9a.train")):
        print("missing %s/a9a.train" % args.data, file=sys.stderr)
        return 2
    print("%s: %d servers, %d workers, %s, %d epochs of a9a (%s)" %
          (args.what, args.servers, args.workers, args.mode, args.epochs,
           load()), flush=True)
    ok = {"recovery": recovery, "cost": cost,
          "elastic": elastic}[args.what](args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
