#!/usr/bin/env python3
"""The cost of replication with several replica/linger settings, interleaved.

  python3 bench/replication_cost.py --mode asp --rounds 4 0:0 1:0 1:5

Each SETTING is REPLICAS:LINGER_MS (fault_tolerance.replicas and
fault_tolerance.replication_linger_ms), or REPLICAS:LINGER_MS:log for the
per-input replication log instead of deltas
(fault_tolerance.replicate_deltas=false). Every round launches the a9a job of
bench/failover_bench.py (3 servers x 2 workers) once per setting, in the
order given, and prints its job seconds, the CPU seconds of all its
processes (user + sys of ps_launch's children) and the load average before
it; then, per setting, the medians and the per-round CPU ratio to the first
setting (pairs run back to back see the same machine, so the per-round
ratios are the measure on a machine whose speed drifts). It prints the
training throughput ratio (examples/s of the first setting over this one's:
the issue's "examples/s with 0 and 1 replicas") beside the CPU ratio, and
before each round the speed of each vCPU alone and together
(failover_bench.machine_probe): where two busy vCPUs share one core's
throughput, the CPU seconds of overlapping processes are inflated, and a
replica's work, which overlaps its primary's, more than the rest.
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import failover_bench  # noqa: E402  (its job and its launch())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("settings", nargs="+", help="REPLICAS:LINGER_MS[:log]")
    ap.add_argument("--mode", default="asp", choices=["bsp", "ssp", "asp"])
    ap.add_argument("--tau", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data",
                                                   "a9a"))
    ap.add_argument("--set", action="append", default=[],
                    help="KEY=VALUE for every launch (ps_launch --set)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs",
                                                  "replication_cost"))
    args = ap.parse_args()
    for s in args.settings:
        f = s.split(":")
        if len(f) not in (2, 3) or (len(f) == 3 and f[2] != "log"):
            ap.error("setting %r is not REPLICAS:LINGER_MS[:log]" % s)
    # What failover_bench.launch() reads.
    args.data = os.path.abspath(args.data)
    args.servers, args.workers = 3, 2
    if args.mode != "ssp":
        args.tau = 0  # as failover_bench.py
    results = {s: [] for s in args.settings}
    for r in range(args.rounds):
        print("round %d: %s" % (r, failover_bench.machine_probe()),
              flush=True)
        for s in args.settings:
            f = s.split(":")
            replicas, linger = f[0], f[1]
            load = failover_bench.load()
            rep, wall, cpu, _ = failover_bench.launch(
                args, "r%d-%s" % (r, s.replace(":", "-")),
                ["fault_tolerance.replicas=" + replicas,
                 "fault_tolerance.replication_linger_ms=" + linger,
                 "fault_tolerance.replicate_deltas=" +
                 ("false" if len(f) == 3 else "true")], [])
            if rep is None:
                return 1  # launch() printed why
            results[s].append((wall, cpu, rep["examples_per_sec"]))
            print("round %d %s: job %.2f s, cpu %.2f s, %.0f examples/s, "
                  "auc %.4f (%s)" %
                  (r, s, rep["job_seconds"], cpu, rep["examples_per_sec"],
                   rep["test_auc"], load),
                  flush=True)
    base = args.settings[0]
    for s in args.settings:
        ratios = [results[s][i][1] / results[base][i][1]
                  for i in range(args.rounds)]
        print("%s: median wall %.2f s, cpu %.2f s; cpu ratio to %s per round: "
              "%s (median %.2f)" %
              (s, statistics.median(x[0] for x in results[s]),
               statistics.median(x[1] for x in results[s]), base,
               " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
        slow = [results[base][i][2] / results[s][i][2]
                for i in range(args.rounds)]
        print("%s: examples/s ratio (%s over this) per round: %s (median %.2f)"
              % (s, base, " ".join("%.2f" % x for x in slow),
                 statistics.median(slow)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
