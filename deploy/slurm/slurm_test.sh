#!/usr/bin/env bash
# The Slurm job script (deploy/slurm/paramserver.sbatch) on real Slurm
# daemons: a private one-host cluster (munged, slurmctld, three slurmd
# standing for nodes n0..n2, all on 127.0.0.1, state and sockets in a
# temporary folder; /etc/slurm is never read) runs
#   1. the a9a job as a heterogeneous job (scheduler : 2 servers : 2 workers);
#      the report's test AUC must be >= 0.90 and Slurm must account every
#      component COMPLETED with exit code 0 (job completion file and
#      scontrol);
#   2. the same job with srun --multi-prog over two nodes (one het group);
#   3. a long job cancelled with scancel: every process of it must exit, the
#      report must say failed/cancelled, Slurm must say CANCELLED.
# Installs Debian's slurm-wlm and munge when missing (as root, no service
# started); exits 77 (skipped) only when they cannot be installed or the a9a
# data is missing. Stops every daemon it started, on any exit.
#
#   slurm_test.sh --bin BUILD/bin --source SOURCE_DIR [--cases het,multiprog,cancel]
set -uo pipefail

SKIP=77
bin="" src="" cases="het,multiprog,cancel"
while (($#)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --source) src="$2"; shift 2 ;;
    --cases) cases="$2"; shift 2 ;;
    *) echo "usage: $0 --bin DIR --source DIR [--cases LIST]" >&2; exit 2 ;;
  esac
done
[[ -n "$bin" && -n "$src" ]] || { echo "usage: $0 --bin DIR --source DIR" >&2; exit 2; }

log() { echo "[slurm_test $(date +%T)] $*"; }
fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIPPED: $*"; exit "$SKIP"; }

for b in ps_scheduler ps_server ps_worker; do
  [[ -x "$bin/$b" ]] || fail "no $bin/$b: build ps_scheduler_bin ps_server_bin ps_worker_bin first"
done
config="$src/deploy/configs/a9a.yaml"
data="$src/../shared/data/a9a"
[[ -s "$data/a9a.train" && -s "$data/a9a.test" ]] ||
  skip "a9a data missing ($data/a9a.train, a9a.test)"
command -v python3 >/dev/null || fail "python3 is needed (deploy/install_deps.sh installs it)"

# ---------------------------------------------------------------------------
# Packages.
need_install() {
  local c
  for c in munged slurmctld slurmd sbatch srun scontrol squeue scancel; do
    command -v "$c" >/dev/null || return 0
  done
  return 1
}
if need_install; then
  [[ $(id -u) -eq 0 ]] ||
    skip "slurm-wlm and munge are not installed and this is not root (apt-get install slurm-wlm munge)"
  log "installing slurm-wlm and munge (apt-get)"
  # No service may start from the packages' scripts: only this test's own
  # daemons run. policy-rc.d is the Debian way; placed only when absent,
  # and removed again.
  policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    policy=/usr/sbin/policy-rc.d
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_install() {
    apt-get -o DPkg::Lock::Timeout=120 install -y -q --no-install-recommends \
      slurm-wlm munge
  }
  ok=""
  if apt_install || { apt-get -o DPkg::Lock::Timeout=120 update -q && apt_install; }; then
    ok=1
  fi
  [[ -n "$policy" ]] && rm -f "$policy"
  [[ -n "$ok" ]] || skip "apt-get could not install slurm-wlm and munge"
  need_install && skip "slurm-wlm and munge installed, but their commands are missing"
fi
# slurmd starts job steps as their users: it needs root.
[[ $(id -u) -eq 0 ]] || skip "slurmd needs root to start job steps"

# ---------------------------------------------------------------------------
# The private cluster. Everything from here on must end within
# PS_SLURM_TEST_BUDGET_S seconds (below ctest's TIMEOUT, so that a hung
# job still fails here and the daemons are stopped by the trap).
budget_end=$((SECONDS + ${PS_SLURM_TEST_BUDGET_S:-240}))
tmp=$(mktemp -d /tmp/ps-slurm-test.XXXXXX) || fail "mktemp"
# munged wants every directory above its socket searchable by all, and none
# writable by others.
chmod 711 "$tmp"
export SLURM_CONF="$tmp/slurm.conf"
daemon_pids=()

# Every process started from this test (daemons, their slurmstepd, job
# tasks) carries PS_SLURM_TEST_MARK=<this test's folder> in its environment;
# this shell does not export it.
mark="PS_SLURM_TEST_MARK=$tmp"
ours() {
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' '\n' < "$p/environ" | grep -qxF "$mark"; } 2>/dev/null &&
      echo "${p#/proc/}"
  done
}

stop_all() {
  local rc=$? pid
  trap - EXIT INT TERM
  if ((${#daemon_pids[@]})); then
    # Jobs first, while slurmd can still stop their steps.
    scancel --quiet --full --user="$(id -un)" 2>/dev/null
    for _ in $(seq 1 40); do
      [[ -z "$(squeue -h 2>/dev/null)" ]] && break
      sleep 0.5
    done
    for pid in "${daemon_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 1 40); do
      local alive=""
      for pid in "${daemon_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [[ -z "$alive" ]] && break
      sleep 0.25
    done
    for pid in "${daemon_pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  fi
  local left
  left=$(ours | tr '\n' ' ')
  if [[ -n "$left" ]]; then
    log "processes of this test still running after the daemons stopped:"
    ps -o pid,args -p "${left// /,}" 2>/dev/null | sed 's/^/  /'
    for pid in $left; do kill -KILL "$pid" 2>/dev/null; done
    ((rc == 0)) && rc=1 && log "FAIL: processes left behind"
  fi
  if ((rc != 0 && rc != SKIP)); then
    for f in "$tmp"/log/slurmctld.log "$tmp"/log/slurmd-n0.log; do
      [[ -f "$f" ]] || continue
      log "last lines of $f:"
      grep -v "pmix\|MPI: Cannot create context" "$f" | tail -n 15 | sed 's/^/  /'
    done
  fi
  if [[ -n "${PS_SLURM_TEST_KEEP:-}" ]]; then
    log "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

mkdir -p "$tmp"/{munge,state,spool,log,jobs} || fail "mkdir"
chmod 700 "$tmp/munge"
head -c 1024 /dev/urandom > "$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"
chmod 711 "$tmp/munge"

env "$mark" munged -F --socket="$tmp/munge/socket" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/seed" \
  --log-file="$tmp/log/munged.log" > "$tmp/log/munged.out" 2>&1 &
daemon_pids+=($!)
for _ in $(seq 1 50); do [[ -S "$tmp/munge/socket" ]] && break; sleep 0.1; done
[[ -S "$tmp/munge/socket" ]] || { cat "$tmp/log/munged.out"; fail "munged did not start"; }
munge -S "$tmp/munge/socket" -n | unmunge -S "$tmp/munge/socket" >/dev/null ||
  fail "munge credentials do not round-trip through $tmp/munge/socket"

# Four free loopback ports: slurmctld and one per slurmd.
read -r p_ctld p_n0 p_n1 p_n2 < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
)
[[ -n "${p_n2:-}" ]] || fail "no free ports"

: > "$tmp/plugstack.conf"
cat > "$SLURM_CONF" <<EOF
# One host standing for three nodes n0..n2 (one slurmd each), so that the
# components of a het job get nodes of their own (the backfill scheduler
# plans a het job's components on whole nodes).
ClusterName=pstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$p_ctld
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
PlugStackConfig=$tmp/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$tmp/jobcomp.txt
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Declares 8 CPUs per node whatever the machine has (a 2-core machine runs
# all 5 tasks).
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=15
SlurmctldTimeout=60
SlurmdTimeout=60
NodeName=n0 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$p_n0 CPUs=8 State=UNKNOWN
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$p_n1 CPUs=8 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$p_n2 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=n[0-2] Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP
EOF

env "$mark" slurmctld -D -f "$SLURM_CONF" > "$tmp/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for n in n0 n1 n2; do
  env "$mark" slurmd -D -N "$n" -f "$SLURM_CONF" > "$tmp/log/slurmd-$n.out" 2>&1 &
  daemon_pids+=($!)
done
for _ in $(seq 1 120); do
  [[ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle')" == 3 ]] && break
  sleep 0.25
done
[[ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle')" == 3 ]] || {
  sinfo -N 2>&1 | sed 's/^/  /'
  tail -n 5 "$tmp"/log/*.out
  fail "the three slurmd did not come up idle within 30 s"
}
log "slurm up: slurmctld 127.0.0.1:$p_ctld, slurmd n0..n2 on $p_n0 $p_n1 $p_n2"
# Loopback only.
if command -v ss >/dev/null; then
  bad=$(ss -Hltnp 2>/dev/null | grep -E "slurm|munge" | grep -E ":($p_ctld|$p_n0|$p_n1|$p_n2)\b" |
        awk '{print $4}' | grep -v '^127\.' || true)
  [[ -z "$bad" ]] || fail "a daemon listens beyond loopback: $bad"
fi

# ---------------------------------------------------------------------------
# Jobs.
sbatch_script="$src/deploy/slurm/paramserver.sbatch"

# submit SBATCH_ARGS... -- SCRIPT_ARGS...: prints the job id. Submitted as
# the README says (the output file and the run dir are the script's
# defaults: paramserver-<id>.out and paramserver-<id>/ in the submit dir).
submit() {
  local -a sargs=()
  while (($#)) && [[ "$1" != -- ]]; do sargs+=("$1"); shift; done
  shift
  (cd "$tmp/jobs" && env "$mark" sbatch --parsable "${sargs[@]}" \
     "$sbatch_script" --config "$config" --bin "$bin" "$@") | cut -d';' -f1
}

# wait_gone ID SECONDS: until Slurm no longer lists the job as pending or
# running.
wait_gone() {
  local id="$1" limit="$2" start=$SECONDS
  ((start + limit > budget_end)) && limit=$((budget_end - start))
  while ((SECONDS - start < limit)); do
    [[ -z "$(squeue -h -j "$id" 2>/dev/null)" ]] && return 0
    sleep 1
  done
  return 1
}

# The job completion records of a job (a het job: of every component).
comp_records() {
  grep -E "^JobId=$1 |HetJobId=$1 " "$tmp/jobcomp.txt" 2>/dev/null
}

# check_accounted ID STATE COMPONENTS: every component's completion record
# and scontrol's view of the job say STATE (and exit code 0:0 for
# COMPLETED).
check_accounted() {
  local id="$1" want="$2" n="$3" recs count
  for _ in $(seq 1 20); do
    recs=$(comp_records "$id")
    count=$(grep -c . <<< "$recs")
    ((count >= n)) && break
    sleep 0.5
  done
  ((count == n)) || fail "job $id: $count completion records, expected $n:\n$recs"
  local bad
  bad=$(grep -v "JobState=$want " <<< "$recs")
  [[ -z "$bad" ]] || fail "job $id: Slurm accounted a component not $want: $bad"
  if [[ "$want" == COMPLETED ]]; then
    bad=$(grep -v " ExitCode=0:0 " <<< "$recs")
    [[ -z "$bad" ]] || fail "job $id: non-zero exit code accounted: $bad"
  fi
  local state
  state=$(scontrol show job "$id" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort -u | tr '\n' ' ')
  [[ "$state" == "JobState=$want " ]] ||
    fail "job $id: scontrol says '$state', expected JobState=$want"
  log "job $id: Slurm accounted $n component(s) $want"
}

# check_report RUN WANT: report.json's status is WANT; for ok, the test AUC
# is >= 0.90; for failed, the error says cancelled. Prints a summary.
check_report() {
  python3 - "$1/report.json" "$2" <<'EOF'
import json, sys
path, want = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
except Exception as e:
    sys.exit(f"unreadable report {path}: {e}")
status, error = r.get("status"), r.get("error", "")
if status != want:
    sys.exit(f"report status {status!r}, expected {want!r} (error: {error!r})")
if want == "ok":
    auc = r.get("test_auc")
    if not isinstance(auc, (int, float)) or auc < 0.90:
        sys.exit(f"test AUC {auc!r} < 0.90")
    print(f"test AUC {auc}")
else:
    if "cancel" not in error:
        sys.exit(f"report error {error!r} does not say cancelled")
    print(f"report failed ({error})")
EOF
}

# check_exited RUN: every process the job started (their pids are in
# RUN/pids) has exited.
check_exited() {
  local run="$1" f pid n=0
  for f in "$run"/pids/*.pid; do
    [[ -e "$f" ]] || continue
    n=$((n + 1))
    pid=$(<"$f")
    kill -0 "$pid" 2>/dev/null &&
      fail "$(basename "$f" .pid) (pid $pid) still runs after its job ended"
  done
  ((n == 5)) || fail "$run/pids has $n pid files, expected 5 (1 + 2 + 2 processes)"
}

check_token() {
  local mode
  mode=$(stat -c %a "$1/token")
  [[ "$mode" == 600 ]] || fail "$1/token has mode $mode, expected 600"
  mode=$(stat -c %a "$1")
  [[ "$mode" == 700 ]] || fail "$1 has mode $mode, expected 700"
}

show_output() {
  log "job output ($1):"
  grep -v "^\s*$" "$1" | tail -n "${2:-25}" | sed 's/^/  /'
}

# run_ok NAME COMPONENTS SBATCH_ARGS... -- SCRIPT_ARGS...
run_ok() {
  local name="$1" comps="$2"; shift 2
  local start=$SECONDS id
  id=$(submit "$@") || fail "sbatch failed"
  [[ "$id" =~ ^[0-9]+$ ]] || fail "sbatch printed no job id: '$id'"
  log "$name: submitted job $id"
  local out="$tmp/jobs/paramserver-$id.out" run="$tmp/jobs/paramserver-$id"
  if ! wait_gone "$id" 150; then
    show_output "$out" 40
    fail "$name: job $id still in the queue after $((SECONDS - start)) s"
  fi
  [[ -s "$out" ]] || fail "$name: no job output at $out (#SBATCH --output)"
  show_output "$out" 12
  check_accounted "$id" COMPLETED "$comps"
  [[ -s "$run/report.json" ]] || fail "$name: no report at $run/report.json"
  local summary
  summary=$(check_report "$run" ok 2>&1) || fail "$name: $summary"
  grep -q "report $run/report.json: status ok" "$out" ||
    fail "$name: the job output does not give the report's status"
  check_exited "$run"
  check_token "$run"
  log "$name: ok: job $id COMPLETED, $summary, $((SECONDS - start)) s"
}

IFS=, read -r -a todo <<< "$cases"
for c in "${todo[@]}"; do
  case "$c" in
    het)
      run_ok het 3 -n1 : -n2 : -n2 -- \
        --set "output.model_dir=$tmp/jobs/model-het"
      ;;
    multiprog)
      run_ok multiprog 1 -N2 -n5 -- --servers 2 \
        --set "output.model_dir=$tmp/jobs/model-multiprog"
      ;;
    cancel)
      start=$SECONDS
      id=$(submit -n1 : -n2 : -n2 -- \
             --set "output.model_dir=$tmp/jobs/model-cancel,training.epochs=100000") ||
        fail "sbatch failed"
      [[ "$id" =~ ^[0-9]+$ ]] || fail "sbatch printed no job id: '$id'"
      out="$tmp/jobs/paramserver-$id.out" run="$tmp/jobs/paramserver-$id"
      log "cancel: submitted job $id"
      # Cancel once every process runs and the workers train.
      for _ in $(seq 1 120); do
        n=$(ls "$run/pids" 2>/dev/null | wc -l)
        ((n == 5)) && grep -q "training:" "$out" 2>/dev/null && break
        sleep 0.5
      done
      ((n == 5)) || { show_output "$out" 30; fail "cancel: the job's 5 processes did not start in 60 s"; }
      sleep 1
      scancel "$id" || fail "scancel $id"
      log "cancel: scancel $id"
      wait_gone "$id" 60 || { show_output "$out" 30; fail "cancel: job $id still listed 60 s after scancel"; }
      show_output "$out" 12
      check_accounted "$id" CANCELLED 3
      summary=$(check_report "$run" failed 2>&1) || fail "cancel: $summary"
      check_exited "$run"
      log "cancel: ok: job $id CANCELLED, $summary, every process exited, $((SECONDS - start)) s"
      ;;
    *) fail "unknown case '$c'" ;;
  esac
done
log "every case passed ($cases)"
