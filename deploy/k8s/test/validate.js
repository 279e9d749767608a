#!/usr/bin/env node
// Validates renderings of deploy/k8s (the output of `kubectl kustomize
// OVERLAY`): every object against the Kubernetes OpenAPI schemas of the npm
// package kubernetes-models (no schema written here), then the references
// between the objects and between the objects and the job config.
//
//   node validate.js --ps-launch PATH RENDERED.yaml...
//       exit 0 when every file passes, 1 with one line per error.
//   node validate.js --ps-launch PATH --self-test RENDERED.yaml
//       breaks a good rendering in the ways below, one at a time, and exits
//       0 only when each break is reported with the expected error.
//
// What the schemas do not catch (the OpenAPI schemas allow unknown fields;
// an API server with strict field validation rejects them at apply time),
// the cross-reference checks below are for.
'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const YAML = require('yaml');

// ---------------------------------------------------------------------------
// Schemas

function modelClass(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/')
    ? apiVersion.split('/')
    : ['', apiVersion];
  let mod;
  try {
    mod = require(`kubernetes-models/${group ? group + '/' : ''}${version}`);
  } catch (e) {
    return null;
  }
  return mod[kind] || null;
}

function checkSchema(obj, err) {
  const Model = modelClass(obj.apiVersion || '', obj.kind || '');
  if (!Model) {
    err(`no Kubernetes schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
    return;
  }
  // kustomize 5 folds long base64 values over lines; the API server
  // decodes them with Go's base64, which skips newlines, but the schema's
  // "byte" format does not: unfold before checking.
  if (obj.kind === 'Secret' && obj.data) {
    obj = { ...obj, data: Object.fromEntries(Object.entries(obj.data).map(
      ([k, v]) => [k, typeof v === 'string' ? v.replace(/[\r\n]/g, '') : v])) };
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    err(`schema: ${e.message}`);
  }
}

// ---------------------------------------------------------------------------
// Helpers

const WORKLOADS = new Set(['StatefulSet', 'Deployment', 'DaemonSet', 'Job',
  'ReplicaSet']);

function podTemplate(obj) {
  return obj.spec && obj.spec.template ? obj.spec.template : null;
}

function labelsMatch(selector, labels) {
  if (!selector || Object.keys(selector).length === 0) return false;
  return Object.entries(selector).every(([k, v]) => (labels || {})[k] === v);
}

// "--flag=value" or "--flag value" in a container's args (and command).
function flagValue(container, flag) {
  const argv = [...(container.command || []), ...(container.args || [])];
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i].startsWith(flag + '=')) return argv[i].slice(flag.length + 1);
    if (argv[i] === flag && i + 1 < argv.length) return argv[i + 1];
  }
  return undefined;
}

function containerPort(container, port) {
  return (container.ports || []).find((p) =>
    typeof port === 'number' ? p.containerPort === port : p.name === port);
}

// The volume mount a path lies in (longest mountPath prefix), or null.
function mountOf(container, file) {
  let best = null;
  for (const m of container.volumeMounts || []) {
    const dir = m.mountPath.replace(/\/+$/, '');
    if ((file === dir || file.startsWith(dir + '/')) &&
        (!best || dir.length > best.mountPath.length)) {
      best = m;
    }
  }
  return best;
}

function dataKeys(obj) {
  return new Set([...Object.keys(obj.data || {}),
    ...Object.keys(obj.stringData || {}),
    ...Object.keys(obj.binaryData || {})]);
}

function configText(configMap, key) {
  if (configMap.data && key in configMap.data) return configMap.data[key];
  if (configMap.binaryData && key in configMap.binaryData) {
    return Buffer.from(configMap.binaryData[key], 'base64').toString();
  }
  return undefined;
}

// ---------------------------------------------------------------------------
// The checks of one rendering; returns the error lines.

function validate(objects, options) {
  const errors = [];
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const find = (kind, name) =>
    objects.find((o) => o.kind === kind && o.metadata && o.metadata.name === name);

  const seen = new Set();
  for (const obj of objects) {
    const id = `${obj.kind}/${obj.metadata && obj.metadata.name}`;
    const err = (m) => errors.push(`${id}: ${m}`);
    checkSchema(obj, err);
    if (seen.has(id)) err('defined twice');
    seen.add(id);
  }

  const workloads = objects.filter((o) => WORKLOADS.has(o.kind) && podTemplate(o));
  const pods = workloads.map((w) => ({ workload: w, template: podTemplate(w) }));

  // Pod templates: labels, references, mounts, ports, probes.
  for (const { workload, template } of pods) {
    const id = `${workload.kind}/${workload.metadata.name}`;
    const err = (m) => errors.push(`${id}: ${m}`);
    const spec = template.spec || {};
    const labels = (template.metadata || {}).labels || {};
    const sel = workload.spec.selector;
    if (workload.kind !== 'Job' &&
        !(sel && labelsMatch(sel.matchLabels, labels))) {
      err(`spec.selector ${JSON.stringify(sel)} does not select its own pod ` +
          `template (labels ${JSON.stringify(labels)})`);
    }
    if (workload.kind === 'StatefulSet') {
      const svc = find('Service', workload.spec.serviceName);
      if (!svc) {
        err(`spec.serviceName ${workload.spec.serviceName}: no such Service`);
      } else {
        if (svc.spec.clusterIP !== 'None') {
          err(`spec.serviceName ${svc.metadata.name}: not a headless Service ` +
              '(clusterIP: None)');
        }
        if (!labelsMatch(svc.spec.selector, labels)) {
          err(`spec.serviceName ${svc.metadata.name}: the Service does not ` +
              'select the pods of this StatefulSet');
        }
      }
    }
    const volumes = new Map((spec.volumes || []).map((v) => [v.name, v]));
    const claimTemplates = new Set(((workload.spec.volumeClaimTemplates) || [])
      .map((c) => c.metadata.name));
    for (const v of spec.volumes || []) {
      if (v.configMap) {
        const cm = find('ConfigMap', v.configMap.name);
        if (!cm) err(`volume ${v.name}: no ConfigMap ${v.configMap.name}`);
        for (const item of (v.configMap.items || [])) {
          if (cm && !dataKeys(cm).has(item.key)) {
            err(`volume ${v.name}: ConfigMap ${v.configMap.name} has no key ${item.key}`);
          }
        }
      }
      if (v.secret) {
        const s = find('Secret', v.secret.secretName);
        if (!s) err(`volume ${v.name}: no Secret ${v.secret.secretName}`);
        for (const item of (v.secret.items || [])) {
          if (s && !dataKeys(s).has(item.key)) {
            err(`volume ${v.name}: Secret ${v.secret.secretName} has no key ${item.key}`);
          }
        }
      }
      if (v.persistentVolumeClaim &&
          !find('PersistentVolumeClaim', v.persistentVolumeClaim.claimName)) {
        err(`volume ${v.name}: no PersistentVolumeClaim ${v.persistentVolumeClaim.claimName}`);
      }
    }
    const used = new Set();
    const containers = [...(spec.initContainers || []), ...(spec.containers || [])];
    for (const c of containers) {
      const cerr = (m) => err(`container ${c.name}: ${m}`);
      const env = new Map();
      for (const e of c.env || []) {
        env.set(e.name, e);
        const ref = e.valueFrom || {};
        if (ref.secretKeyRef) {
          const s = find('Secret', ref.secretKeyRef.name);
          if (!s) {
            cerr(`env ${e.name}: no Secret ${ref.secretKeyRef.name}`);
          } else if (!dataKeys(s).has(ref.secretKeyRef.key)) {
            cerr(`env ${e.name}: Secret ${ref.secretKeyRef.name} has no key ${ref.secretKeyRef.key}`);
          }
        }
        if (ref.configMapKeyRef) {
          const cm = find('ConfigMap', ref.configMapKeyRef.name);
          if (!cm) {
            cerr(`env ${e.name}: no ConfigMap ${ref.configMapKeyRef.name}`);
          } else if (!dataKeys(cm).has(ref.configMapKeyRef.key)) {
            cerr(`env ${e.name}: ConfigMap ${ref.configMapKeyRef.name} has no key ${ref.configMapKeyRef.key}`);
          }
        }
        if (ref.fieldRef) {
          const p = ref.fieldRef.fieldPath;
          const m = /^metadata\.(labels|annotations)\['([^']+)'\]$/.exec(p);
          const ok = m ||
            /^(metadata\.(name|namespace|uid|labels|annotations)|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$/.test(p);
          if (!ok) cerr(`env ${e.name}: fieldRef ${p} is not a downward API field`);
          if (m && m[1] === 'annotations' &&
              m[2] === 'batch.kubernetes.io/job-completion-index' &&
              !(workload.kind === 'Job' && workload.spec.completionMode === 'Indexed')) {
            cerr(`env ${e.name}: the completion index exists only in an Indexed Job`);
          }
          if (m && m[1] === 'labels' && m[2] === 'apps.kubernetes.io/pod-index' &&
              workload.kind !== 'StatefulSet') {
            cerr(`env ${e.name}: the pod index label exists only in a StatefulSet`);
          }
        }
      }
      for (const from of c.envFrom || []) {
        if (from.secretRef && !find('Secret', from.secretRef.name)) {
          cerr(`envFrom: no Secret ${from.secretRef.name}`);
        }
        if (from.configMapRef && !find('ConfigMap', from.configMapRef.name)) {
          cerr(`envFrom: no ConfigMap ${from.configMapRef.name}`);
        }
      }
      // $(VAR) in command/args is expanded from the container's env only;
      // an undefined one is passed on literally.
      for (const a of [...(c.command || []), ...(c.args || [])]) {
        for (const m of a.matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!env.has(m[1])) cerr(`argument ${a}: $(${m[1]}) is not an env var of the container`);
        }
      }
      for (const m of c.volumeMounts || []) {
        used.add(m.name);
        if (!volumes.has(m.name) && !claimTemplates.has(m.name)) {
          cerr(`volumeMount ${m.name} (${m.mountPath}): no such volume in the pod`);
        }
      }
      // Files named by flags and env values inside a ConfigMap or Secret
      // mount must be keys of it; files written must be on a writable mount.
      const files = [];
      for (const a of c.args || []) {
        const m = /^--[\w-]+=(\/.*)$/.exec(a);
        if (m) files.push([`argument ${a}`, m[1]]);
      }
      for (const e of c.env || []) {
        if (typeof e.value === 'string' && e.value.startsWith('/')) {
          files.push([`env ${e.name}`, e.value]);
        }
      }
      for (const [what, file] of files) {
        const m = mountOf(c, file);
        const v = m && volumes.get(m.name);
        if (!v) {
          // Nothing of ours is in the image outside /usr.
          if (!file.startsWith('/usr/')) cerr(`${what}: ${file} is on no volume`);
          continue;
        }
        const rel = path.relative(m.mountPath, file);
        if (v.configMap || v.secret) {
          const src = v.configMap ? find('ConfigMap', v.configMap.name)
            : find('Secret', v.secret.secretName);
          const items = (v.configMap || v.secret).items;
          const keys = items ? new Set(items.map((i) => i.path))
            : (src ? dataKeys(src) : new Set());
          if (src && !keys.has(rel)) {
            cerr(`${what}: ${rel} is not a key of the volume ${m.name} mounted at ${m.mountPath}`);
          }
        }
      }
      const readOnlyRoot = c.securityContext && c.securityContext.readOnlyRootFilesystem;
      for (const flag of ['--report', '--state_file']) {
        const file = flagValue(c, flag);
        if (!file) continue;
        const m = mountOf(c, file);
        const v = m && volumes.get(m.name);
        if ((m && (m.readOnly || (v && (v.configMap || v.secret)))) ||
            (!m && readOnlyRoot)) {
          cerr(`${flag} ${file} is not on a writable volume`);
        }
      }
      for (const kind of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
        const probe = c[kind];
        if (!probe) continue;
        const action = probe.grpc || probe.tcpSocket || probe.httpGet;
        if (action && !containerPort(c, action.port)) {
          cerr(`${kind}: port ${action.port} is not a port of the container`);
        }
        // Our nodes' "" is NOT_SERVING until registered: a liveness probe
        // on it would restart a node that is still registering.
        if (kind !== 'readinessProbe' && probe.grpc && probe.grpc.service !== 'liveness') {
          cerr(`${kind}: gRPC health service "${probe.grpc.service || ''}", want "liveness"`);
        }
      }
    }
    for (const v of spec.volumes || []) {
      if (!used.has(v.name)) err(`volume ${v.name} is mounted by no container`);
    }
    const ann = (template.metadata || {}).annotations || {};
    if (ann['prometheus.io/scrape'] === 'true') {
      const port = Number(ann['prometheus.io/port']);
      for (const c of containers) {
        const e = (c.env || []).find((x) => x.name === 'PS_METRICS_PORT');
        if (e && Number(e.value) !== port) {
          err(`container ${c.name}: PS_METRICS_PORT ${e.value} != prometheus.io/port ${port}`);
        }
      }
      if (!containers.some((c) => (c.ports || []).some(
        (p) => p.containerPort === port && p.name === 'metrics'))) {
        err(`prometheus.io/port ${ann['prometheus.io/port']} is no container port named metrics`);
      }
    }
  }

  // Services select pods, and their target ports exist there.
  for (const svc of byKind('Service')) {
    const err = (m) => errors.push(`Service/${svc.metadata.name}: ${m}`);
    const selected = pods.filter((p) =>
      labelsMatch(svc.spec.selector, (p.template.metadata || {}).labels));
    if (selected.length === 0) {
      err(`selector ${JSON.stringify(svc.spec.selector)} selects no pod`);
      continue;
    }
    for (const port of svc.spec.ports || []) {
      const target = port.targetPort === undefined ? port.port : port.targetPort;
      for (const p of selected) {
        if (!(p.template.spec.containers || []).some((c) => containerPort(c, target))) {
          err(`port ${port.name || port.port}: targetPort ${target} is not a ` +
              `port of ${p.workload.kind}/${p.workload.metadata.name}`);
        }
      }
    }
  }

  checkJob(objects, pods, find, errors, options);
  return errors;
}

// The parameter-server job: the config in the ConfigMap, and the commands.
function checkJob(objects, pods, find, errors, options) {
  const role = (bin) => pods.map((p) => ({ ...p,
    container: (p.template.spec.containers || []).find((c) =>
      [...(c.command || []), ...(c.args || [])].some((a) => a.endsWith('/' + bin) || a === bin)),
  })).filter((p) => p.container);
  const schedulers = role('ps_scheduler');
  const servers = role('ps_server');
  const workers = role('ps_worker');
  const jerr = (m) => errors.push(`job: ${m}`);
  if (schedulers.length !== 1 || servers.length !== 1 || workers.length !== 1) {
    jerr(`want one scheduler, one server and one worker workload, got ${schedulers.length}, ` +
         `${servers.length}, ${workers.length}`);
    return;
  }
  const [h, s, w] = [schedulers[0], servers[0], workers[0]];
  const id = (p) => `${p.workload.kind}/${p.workload.metadata.name}`;

  // The config: the file --config names, a key of a mounted ConfigMap.
  const configPath = flagValue(h.container, '--config');
  const mount = configPath && mountOf(h.container, configPath);
  const volume = mount && (h.template.spec.volumes || []).find((v) => v.name === mount.name);
  const cm = volume && volume.configMap && find('ConfigMap', volume.configMap.name);
  const text = cm && configText(cm, path.relative(mount.mountPath, configPath));
  if (text === undefined) {
    jerr(`${id(h)}: --config ${configPath} is not a file of a mounted ConfigMap`);
    return;
  }
  const config = YAML.parse(text) || {};
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ps-k8s-config-'));
  const file = path.join(tmp, 'job.yaml');
  fs.writeFileSync(file, text);
  const check = childProcess.spawnSync(options.psLaunch, ['--check', '--config', file],
    { encoding: 'utf8' });
  fs.rmSync(tmp, { recursive: true, force: true });
  if (check.status !== 0) {
    jerr(`ConfigMap/${cm.metadata.name}: ps_launch --check rejects the config: ` +
         `${(check.stdout + check.stderr).trim().replace(/\n/g, ' | ')}`);
  }
  const cluster = config.cluster || {};
  const numServers = cluster.num_servers === undefined ? 2 : cluster.num_servers;
  const numWorkers = cluster.num_workers === undefined ? 2 : cluster.num_workers;
  if (s.workload.spec.replicas !== numServers) {
    jerr(`${id(s)}: replicas ${s.workload.spec.replicas} != cluster.num_servers ${numServers}`);
  }
  if (w.workload.kind === 'Job') {
    for (const f of ['completions', 'parallelism']) {
      if (w.workload.spec[f] !== numWorkers) {
        jerr(`${id(w)}: ${f} ${w.workload.spec[f]} != cluster.num_workers ${numWorkers}`);
      }
    }
  }
  if (h.workload.spec.replicas !== 1) jerr(`${id(h)}: replicas must be 1`);

  // The scheduler's address as servers and workers have it: a Service that
  // selects the scheduler pod, on the port the scheduler listens on.
  const schedulerPort = Number(flagValue(h.container, '--port'));
  if (!containerPort(h.container, schedulerPort)) {
    jerr(`${id(h)}: --port ${schedulerPort} is not a port of the container`);
  }
  for (const p of [s, w]) {
    const addr = flagValue(p.container, '--scheduler') || '';
    const m = /^([^:]+):(\d+)$/.exec(addr);
    const svc = m && find('Service', m[1].split('.')[0]);
    if (!svc) {
      jerr(`${id(p)}: --scheduler ${addr} is not SERVICE:PORT of a Service here`);
      continue;
    }
    if (!labelsMatch(svc.spec.selector, (h.template.metadata || {}).labels) ||
        pods.some((o) => o.workload !== h.workload && labelsMatch(svc.spec.selector, (o.template.metadata || {}).labels))) {
      jerr(`${id(p)}: --scheduler ${addr}: Service ${svc.metadata.name} does not select ` +
           'the scheduler pod alone');
    }
    const port = (svc.spec.ports || []).find((sp) => sp.port === Number(m[2]));
    const target = port && (port.targetPort === undefined ? port.port : port.targetPort);
    const cport = port && containerPort(h.container, target);
    if (!cport || cport.containerPort !== schedulerPort) {
      jerr(`${id(p)}: --scheduler ${addr}: the Service port does not lead to the ` +
           `scheduler's --port ${schedulerPort}`);
    }
  }
  // Servers listen on every interface at a fixed port they advertise under
  // their stable name.
  const serverPort = Number(flagValue(s.container, '--port'));
  if (!containerPort(s.container, serverPort)) {
    jerr(`${id(s)}: --port ${flagValue(s.container, '--port')} is not a port of the container`);
  }
  if (flagValue(s.container, '--bind') !== '0.0.0.0') jerr(`${id(s)}: --bind must be 0.0.0.0`);
  if (cluster.bind_host !== '0.0.0.0') {
    jerr(`ConfigMap/${cm.metadata.name}: cluster.bind_host must be 0.0.0.0 (the scheduler ` +
         `listens on the pod's interfaces), got ${cluster.bind_host}`);
  }
  const advertise = flagValue(s.container, '--advertise') || '';
  if (s.workload.kind === 'StatefulSet' &&
      !advertise.startsWith(`$(POD_NAME).${s.workload.spec.serviceName}.`)) {
    jerr(`${id(s)}: --advertise ${advertise} is not the pod's stable name ` +
         `$(POD_NAME).${s.workload.spec.serviceName}....`);
  }
  // Writable places: the model (servers) on a writable volume.
  const modelDir = (config.output || {}).model_dir;
  const mm = modelDir && mountOf(s.container, modelDir);
  const mv = mm && (s.template.spec.volumes || []).find((v) => v.name === mm.name);
  if (!mm || mm.readOnly || (mv && (mv.configMap || mv.secret))) {
    jerr(`${id(s)}: output.model_dir ${modelDir} of the config is on no writable volume`);
  }
  // Every process: the token from a Secret; TLS for all or none, and no
  // gRPC probe on a TLS port (the kubelet's gRPC probe speaks plaintext).
  let tls = null;
  for (const p of [h, s, w]) {
    const env = new Map((p.container.env || []).map((e) => [e.name, e]));
    const token = env.get('PS_AUTH_TOKEN');
    if (!token || !token.valueFrom || !token.valueFrom.secretKeyRef) {
      jerr(`${id(p)}: PS_AUTH_TOKEN does not come from a Secret`);
    }
    const hasTls = env.has('PS_TLS_CA_FILE');
    if (tls !== null && hasTls !== tls) jerr('PS_TLS_* set for some processes only');
    tls = hasTls;
    for (const kind of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
      if (hasTls && p.container[kind] && p.container[kind].grpc) {
        jerr(`${id(p)}: ${kind} uses grpc on a TLS port (the kubelet's gRPC probe has no TLS)`);
      }
    }
  }
  // GPUs: a worker with a GPU trains on it, a cuda job gets GPUs.
  const backend = (config.training || {}).backend || 'cpu';
  const gpus = ((w.container.resources || {}).limits || {})['nvidia.com/gpu'];
  if (backend === 'cuda' && !gpus) {
    jerr(`training.backend cuda but ${id(w)} has no nvidia.com/gpu limit`);
  }
  if (gpus && backend === 'cpu') {
    jerr(`${id(w)} has nvidia.com/gpu but training.backend is cpu`);
  }
}

// ---------------------------------------------------------------------------
// Self test: each break of a good rendering must be reported.

const BREAKS = [
  ['Service selector misses the scheduler',
    (o) => { svc(o, 'ps-scheduler').spec.selector['app.kubernetes.io/component'] = 'schedular'; },
    'Service/ps-scheduler: selector'],
  ['env secretKeyRef to a missing key',
    (o) => { env(ctr(o, 'ps-server'), 'PS_AUTH_TOKEN').valueFrom.secretKeyRef.key = 'tokn'; },
    'has no key tokn'],
  ['env secretKeyRef to a missing Secret',
    (o) => { env(ctr(o, 'ps-worker'), 'PS_AUTH_TOKEN').valueFrom.secretKeyRef.name = 'nope'; },
    'no Secret nope'],
  ['volumeMount without a volume',
    (o) => { ctr(o, 'ps-scheduler').volumeMounts[0].name = 'jobs'; },
    'volumeMount jobs'],
  ['volume of a missing ConfigMap',
    (o) => { tpl(o, 'ps-scheduler').spec.volumes.find((v) => v.configMap).configMap.name = 'x'; },
    'no ConfigMap x'],
  ['--config not a key of the ConfigMap',
    (o) => { setFlag(ctr(o, 'ps-scheduler'), '--config', '/etc/paramserver/job/jobs.yaml'); },
    'jobs.yaml is not a key'],
  ['a config ps_launch --check rejects',
    (o) => { cfg(o).data['job.yaml'] += '\nnot_a_section:\n  x: 1\n'; },
    'ps_launch --check rejects'],
  ['server replicas != num_servers',
    (o) => { wl(o, 'ps-server').spec.replicas = 3; },
    'replicas 3 != cluster.num_servers'],
  ['worker completions != num_workers',
    (o) => { wl(o, 'ps-worker').spec.completions = 1; },
    'completions 1 != cluster.num_workers'],
  ['--scheduler names no Service',
    (o) => { setFlag(ctr(o, 'ps-worker'), '--scheduler', 'scheduler:7000'); },
    '--scheduler scheduler:7000'],
  ['--scheduler on the wrong port',
    (o) => { setFlag(ctr(o, 'ps-server'), '--scheduler', 'ps-scheduler:7001'); },
    'does not lead to the scheduler'],
  ['probe on a port the container lacks',
    (o) => { ctr(o, 'ps-server').readinessProbe.grpc.port = 7101; },
    'readinessProbe: port 7101'],
  ['$(VAR) not in env',
    (o) => { const c = ctr(o, 'ps-server'); c.env = c.env.filter((e) => e.name !== 'POD_NAME'); },
    '$(POD_NAME) is not an env var'],
  ['schema: a port as a string',
    (o) => { ctr(o, 'ps-server').ports[0].containerPort = '7100'; },
    'containerPort must be integer'],
  ['schema: a container without a name',
    (o) => { delete ctr(o, 'ps-worker').name; },
    'must have required property name'],
  ['StatefulSet selector misses its pods',
    (o) => { wl(o, 'ps-server').spec.selector.matchLabels['app.kubernetes.io/component'] = 's'; },
    'does not select its own pod template'],
  ['model_dir on the read-only root',
    (o) => { ctr(o, 'ps-server').volumeMounts = []; tpl(o, 'ps-server').spec.volumes = []; },
    'output.model_dir'],
  ['metrics annotation without the port',
    (o) => { tpl(o, 'ps-worker').metadata.annotations['prometheus.io/port'] = '9401'; },
    'prometheus.io/port 9401'],
  ['liveness on the life-cycle health',
    (o) => { delete ctr(o, 'ps-server').livenessProbe.grpc.service; },
    'livenessProbe: gRPC health service "", want "liveness"'],
  ['metrics on another port than scraped',
    (o) => { env(ctr(o, 'ps-scheduler'), 'PS_METRICS_PORT').value = '9500'; },
    'PS_METRICS_PORT 9500 != prometheus.io/port 9400'],
  ['a GPU worker on a cpu job',
    (o) => { ctr(o, 'ps-worker').resources.limits['nvidia.com/gpu'] = 1; },
    'has nvidia.com/gpu but training.backend is cpu'],
];

const wl = (o, name) => o.find((x) => WORKLOADS.has(x.kind) && x.metadata.name === name);
const tpl = (o, name) => wl(o, name).spec.template;
const ctr = (o, name) => tpl(o, name).spec.containers[0];
const svc = (o, name) => o.find((x) => x.kind === 'Service' && x.metadata.name === name);
const cfg = (o) => o.find((x) => x.kind === 'ConfigMap');
const env = (c, name) => c.env.find((e) => e.name === name);
function setFlag(c, flag, value) {
  const i = c.args.findIndex((a) => a.startsWith(flag + '='));
  if (i < 0) throw new Error(`no ${flag} in ${c.name}`);
  c.args[i] = `${flag}=${value}`;
}

function selfTest(objects, options) {
  const base = validate(objects, options);
  if (base.length > 0) {
    console.log('self-test: the unbroken rendering does not pass:\n  ' + base.join('\n  '));
    return false;
  }
  let ok = true;
  for (const [what, breakIt, expected] of BREAKS) {
    const copy = JSON.parse(JSON.stringify(objects));
    breakIt(copy);
    const errors = validate(copy, options);
    const hit = errors.some((e) => e.includes(expected));
    console.log(`self-test: ${hit ? 'caught' : 'MISSED'}: ${what}` +
                (hit ? '' : ` (wanted "${expected}", got: ${errors.join(' | ') || 'no error'})`));
    ok = ok && hit;
  }
  return ok;
}

// ---------------------------------------------------------------------------

// The job config of a rendering (the ConfigMap's job.yaml), parsed.
function jobConfig(objects) {
  const cm = objects.find((o) => o.kind === 'ConfigMap' && configText(o, 'job.yaml') !== undefined);
  return cm ? YAML.parse(configText(cm, 'job.yaml')) : null;
}

// Whether two renderings' job configs are equal but for `field` (a.b).
function sameConfigExcept(field, a, b) {
  const [ca, cb] = [jobConfig(a), jobConfig(b)];
  if (!ca || !cb) {
    console.log('no job.yaml ConfigMap in a rendering');
    return false;
  }
  const [section, key] = field.split('.');
  for (const c of [ca, cb]) if (c[section]) delete c[section][key];
  const diff = JSON.stringify(ca) !== JSON.stringify(cb);
  console.log(diff ? `the job configs differ in more than ${field}:\n  ${JSON.stringify(ca)}\n  ${JSON.stringify(cb)}`
    : `the job configs differ only in ${field}`);
  return !diff;
}

function readObjects(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
  const bad = docs.find((d) => d.errors.length > 0);
  if (bad) throw new Error(`${file}: YAML: ${bad.errors[0].message}`);
  return docs.map((d) => d.toJS()).filter((o) => o);
}

function main(argv) {
  const options = { psLaunch: null };
  let self = false;
  let except = null;
  const files = [];
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--ps-launch') options.psLaunch = argv[++i];
    else if (argv[i] === '--self-test') self = true;
    else if (argv[i] === '--same-config-except') except = argv[++i];
    else files.push(argv[i]);
  }
  if (!options.psLaunch || files.length === 0) {
    console.error('usage: validate.js --ps-launch PATH [--self-test] RENDERED.yaml...\n' +
                  '       validate.js --ps-launch PATH --same-config-except FIELD A.yaml B.yaml');
    return 2;
  }
  if (except) {
    return files.length === 2 &&
      sameConfigExcept(except, readObjects(files[0]), readObjects(files[1])) ? 0 : 1;
  }
  let ok = true;
  for (const file of files) {
    let objects;
    try {
      objects = readObjects(file);
    } catch (e) {
      console.log(e.message);
      ok = false;
      continue;
    }
    if (self) {
      ok = selfTest(objects, options) && ok;
      continue;
    }
    const errors = validate(objects, options);
    const kinds = objects.map((o) => `${o.kind}/${o.metadata.name}`).join(', ');
    if (errors.length === 0) {
      console.log(`${file}: ok: ${objects.length} objects valid (${kinds})`);
    } else {
      ok = false;
      for (const e of errors) console.log(`${file}: ${e}`);
    }
  }
  return ok ? 0 : 1;
}

process.exitCode = main(process.argv.slice(2));
