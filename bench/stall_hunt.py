#!/usr/bin/env python3
"""Hunts a server that stalls (issue 9, stop 58: a false failover in the soak).

    python3 bench/stall_hunt.py [RUNS] [MODE] [KEY=VALUE...]  (defaults: 100 ssp)

Runs the a9a job (deploy/configs/a9a.yaml, ../shared/data/a9a) RUNS times in
MODE. While a launch runs, as soon as a worker names a silent server ("S[i]
has answered nothing for"), it writes that server's threads (state, wchan,
kernel stack from /proc; `gdb` backtraces) and the machine's pressure stall
figures to runs/stall_hunt/runN/dump.txt, and /proc/pressure/io and the vCPUs' steal
(/proc/stat) every 50 ms to psi.txt. It stops at the first launch that names a server or is not ok;
passing launches are removed. Run it beside a load (a build) to provoke it.
"""
import os, re, subprocess, sys, time, glob
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
MODE = sys.argv[2] if len(sys.argv) > 2 else 'ssp'
# PS_BIN_DIR: the binaries (default build/bin); a copy lets a build go on.
BIN = os.environ.get('PS_BIN_DIR', os.path.join(ROOT, 'build', 'bin'))
out = os.path.join(ROOT, 'runs', 'stall_hunt')
os.makedirs(out, exist_ok=True)

def server_pids(launcher):
    # Only this launch's servers (children of its ps_launch): tests running
    # beside the hunt start ps_server processes with the same ids.
    pids = {}
    for p in glob.glob('/proc/[0-9]*'):
        try:
            cmd = open(p + '/cmdline', 'rb').read().split(b'\0')
            ppid = int(open(p + '/stat').read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and cmd and cmd[0].endswith(b'ps_server'):
            sid = None
            for j, a in enumerate(cmd):
                if a == b'--id' and j + 1 < len(cmd): sid = int(cmd[j + 1])
            pids[sid] = int(p.split('/')[-1])
    return pids

def dump(pid, f):
    f.write(f'== pid {pid} tasks {os.listdir(f"/proc/{pid}/task")}\n')
    f.write(open(f'/proc/{pid}/status').read())
    for t in sorted(glob.glob(f'/proc/{pid}/task/*')):
        try:
            st = open(t + '/stat').read()
            comm = open(t + '/comm').read().strip()
            wchan = open(t + '/wchan').read().strip()
            try:
                ks = open(t + '/stack').read().strip().replace('\n', ' | ')
            except OSError:
                ks = '?'
            state = st.rsplit(')', 1)[1].split()[0]
            f.write(f'{t.split("/")[-1]} {comm} {state} wchan={wchan} kstack={ks}\n')
        except OSError as e:
            f.write(f'{t} error {e}\n')
    for pr in ('cpu', 'io', 'memory'):
        f.write(pr + ': ' + open('/proc/pressure/' + pr).read())
    f.flush()
    r = subprocess.run(['gdb', '-p', str(pid), '-batch', '-ex',
                        'thread apply all bt 25'], capture_output=True,
                       text=True, timeout=60)
    f.write(r.stdout[-200000:])
    f.write(r.stderr[-20000:])

for i in range(N):
    d = f'{out}/run{i}'
    subprocess.run(['rm', '-rf', d]); os.makedirs(d)
    log = open(d + '/output.log', 'w')
    t0 = time.time()
    p = subprocess.Popen([BIN + '/ps_launch', '--config',
                          ROOT + '/deploy/configs/a9a.yaml', '--mode', MODE,
                          '--run-dir', d + '/run', '--report', d + '/report.json',
                          '--set', 'output.model_dir=' + d + '/model']
                         + [a for kv in sys.argv[3:] for a in ('--set', kv)],
                         stdout=log, stderr=subprocess.STDOUT)
    caught = False
    psi = []
    first_pids = None
    while p.poll() is None:
        time.sleep(0.05)
        # io pressure, and each vCPU's steal (jiffies the hypervisor ran
        # something else): a vCPU stolen for seconds freezes what runs on it.
        steal = ' '.join(l.split()[8] for l in open('/proc/stat')
                         if l.startswith('cpu'))
        psi.append((time.time(), open('/proc/pressure/io').read().split('\n')[1]
                    + ' steal ' + steal))
        txt = open(d + '/output.log').read()
        if first_pids is None and 'configured: epoch 1' in txt:
            first_pids = server_pids(p.pid)
        m = re.search(r'S\[(\d+)\] has answered nothing for', txt)
        if m and not caught:
            caught = True
            sid = int(m.group(1))
            pids = server_pids(p.pid)
            print('first pids', first_pids, 'now', pids, flush=True)
            with open(d + '/dump.txt', 'w') as f:
                f.write(f'suspect S[{sid}] pids {pids}\n')
                if sid in pids: dump(pids[sid], f)
    p.wait()
    rep = open(d + '/report.json').read() if os.path.exists(d + '/report.json') else ''
    ok = '"status": "ok"' in rep and '"failovers": []' in rep
    print(f'run {i} {"ok" if ok else "FAIL"} {time.time()-t0:.1f}s caught={caught} load={open("/proc/loadavg").read().split()[0]}', flush=True)
    if caught or not ok:
        with open(d + '/psi.txt', 'w') as f:
            for t, l in psi: f.write(f'{t:.2f} {l}\n')
        break
    subprocess.run(['rm', '-rf', d])
