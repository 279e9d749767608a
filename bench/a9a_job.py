"""The sparse-LR job on a9a that bench/failover_bench.py and
bench/chaos_mix.py launch: its config and its ps_launch command line."""

import os

# FTRL on a9a with a 100-example minibatch: AUC 0.90 in two epochs, and
# short enough to launch hundreds of times.
YAML = """cluster:
  num_servers: {servers}
  num_workers: {workers}
  virtual_nodes: 64
consistency:
  mode: {mode}
  tau: {tau}
optimizer:
  name: ftrl
  alpha: 0.5
  beta: 100
  l1: 0.1
  l2: 0.1
data:
  format: libsvm
  train: {data}/a9a.train
  test: {data}/a9a.test
training:
  minibatch: 100
  epochs: {epochs}
output:
  log_level: warn
"""


def prepare(d, bin_dir, servers, workers, mode, tau, data, epochs, sets=()):
    """Writes d/job.yaml; returns (ps_launch command, d/report.json).

    `sets` are --set overrides (field=value), applied in order after the
    file; the run, report and model go under `d`."""
    cfg = os.path.join(d, "job.yaml")
    with open(cfg, "w") as f:
        f.write(YAML.format(servers=servers, workers=workers, mode=mode,
                            tau=tau, data=data, epochs=epochs))
    report = os.path.join(d, "report.json")
    cmd = [os.path.join(bin_dir, "ps_launch"), "--config", cfg,
           "--run-dir", os.path.join(d, "run"), "--report", report,
           "--set", "output.model_dir=" + os.path.join(d, "model"),
           "--timeout_s", "300"]
    for s in sets:
        cmd += ["--set", s]
    return cmd, report
