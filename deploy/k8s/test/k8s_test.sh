#!/bin/bash
# The Kubernetes manifests' test (ctest -L k8s): renders every overlay of
# deploy/k8s with `kubectl kustomize` and validates each object against the
# Kubernetes OpenAPI schemas of the npm package kubernetes-models, then the
# cross-references (validate.js), the ConfigMap's config with
# `ps_launch --check`, and that broken copies of the manifests fail.
#
#   k8s_test.sh --ps-launch BUILD/bin/ps_launch --work BUILD/k8s-test
#
# Installs what it needs: nodejs and npm (apt-get, when missing and root),
# the npm packages of package-lock.json (into WORK/npm), and Debian's
# kubernetes-client (kubectl 1.20, kustomize 2.0.3; `apt-get download` into
# WORK, not installed). A `kubectl` already on PATH (a newer kustomize)
# renders too. Exits 77 (ctest: skipped) only when these cannot be had.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
k8s=$(dirname "$here")
ps_launch=
work=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ps-launch) ps_launch=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "k8s_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x $ps_launch && -n $work ]] || {
  echo "usage: k8s_test.sh --ps-launch PATH --work DIR" >&2
  exit 2
}
mkdir -p "$work"
work=$(cd "$work" && pwd)
skip() { echo "k8s_test: SKIPPED: $*"; exit 77; }
fail() { echo "k8s_test: FAILED: $*"; exit 1; }
step() { echo "k8s_test: $* ($SECONDS s)"; }

# --- Tools -----------------------------------------------------------------
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    step "installing nodejs and npm (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      nodejs npm >"$work/apt.log" 2>&1 ||
      { apt-get update -q >>"$work/apt.log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
          --no-install-recommends nodejs npm >>"$work/apt.log" 2>&1; } ||
      skip "nodejs/npm cannot be installed (see $work/apt.log)"
  else
    skip "node and npm are missing and cannot be installed (not root or no apt-get)"
  fi
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
(( node_major >= 14 )) || skip "node $(node --version) is older than 14"

npm_dir=$work/npm
if ! cmp -s "$here/package-lock.json" "$npm_dir/package-lock.json" ||
   [[ ! -d $npm_dir/node_modules/kubernetes-models ]]; then
  step "installing the npm packages into $npm_dir"
  rm -rf "$npm_dir" && mkdir -p "$npm_dir"
  cp "$here/package.json" "$here/package-lock.json" "$npm_dir/"
  (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error) \
    >"$work/npm.log" 2>&1 || {
      rm -rf "$npm_dir"
      skip "npm ci failed (no npm registry?), see $work/npm.log"
    }
fi
export NODE_PATH=$npm_dir/node_modules

renderers=()
deb_kubectl=$work/kubernetes-client/usr/bin/kubectl
if [[ ! -x $deb_kubectl ]]; then
  step "fetching Debian's kubernetes-client (apt-get download)"
  rm -rf "$work/deb" && mkdir -p "$work/deb"
  if (cd "$work/deb" && apt-get download kubernetes-client) >"$work/deb.log" 2>&1 ||
     { [[ $(id -u) == 0 ]] && apt-get update -q >>"$work/deb.log" 2>&1 &&
       (cd "$work/deb" && apt-get download kubernetes-client) >>"$work/deb.log" 2>&1; }; then
    dpkg-deb -x "$work"/deb/kubernetes-client_*.deb "$work/kubernetes-client"
  fi
fi
[[ -x $deb_kubectl ]] && renderers+=("$deb_kubectl")
if command -v kubectl >/dev/null &&
   [[ $(readlink -f "$(command -v kubectl)") != $(readlink -f "$deb_kubectl") ]]; then
  renderers+=("$(command -v kubectl)")
fi
(( ${#renderers[@]} > 0 )) ||
  skip "no kubectl: Debian's kubernetes-client cannot be downloaded (see $work/deb.log)"
for r in "${renderers[@]}"; do
  step "renderer: $r ($("$r" version --client 2>/dev/null | head -1 | tr -s ' '))"
done

# --- Render and validate -----------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$k8s" "$tmp/k8s"
rm -rf "$tmp/k8s/base/secrets" "$tmp/k8s/overlays/tls/secrets"
"$tmp/k8s/make-secrets.sh" --dir "$tmp/k8s" >/dev/null || fail "make-secrets.sh failed"

# render KUSTOMIZE_DIR OUT: every renderer; OUT.<i>.yaml for renderer i.
render() {
  local i=0
  for r in "${renderers[@]}"; do
    "$r" kustomize "$1" >"$2.$i.yaml" 2>"$2.$i.err" || {
      cat "$2.$i.err"
      return 1
    }
    i=$((i + 1))
  done
}

overlays=()
for o in "$k8s"/overlays/*/; do overlays+=("$(basename "$o")"); done
(( ${#overlays[@]} >= 3 )) || fail "want the overlays cpu, gpu and tls, found ${overlays[*]}"
mkdir -p "$tmp/out"
for o in "${overlays[@]}"; do
  render "$tmp/k8s/overlays/$o" "$tmp/out/$o" || fail "kubectl kustomize overlays/$o failed"
done
step "rendered ${overlays[*]} with ${#renderers[@]} kubectl(s)"
node "$here/validate.js" --ps-launch "$ps_launch" "$tmp"/out/*.yaml ||
  fail "the renderings do not validate"
node "$here/validate.js" --ps-launch "$ps_launch" \
  --same-config-except training.backend "$tmp/out/cpu.0.yaml" "$tmp/out/gpu.0.yaml" ||
  fail "overlays/gpu/job.yaml drifted from base/job.yaml"

# --- The checks catch breaks -------------------------------------------------
step "self-test: breaks of a good rendering"
node "$here/validate.js" --ps-launch "$ps_launch" --self-test "$tmp/out/cpu.0.yaml" ||
  fail "the validator missed a break"

# broken OVERLAY FILE SED_SCRIPT EXPECTED: a copy of the manifests with FILE
# edited must render OVERLAY, and fail validation with EXPECTED in the output.
broken() {
  local overlay=$1
  shift
  rm -rf "$tmp/broken" && cp -r "$tmp/k8s" "$tmp/broken"
  sed -i "$2" "$tmp/broken/$1"
  if cmp -s "$tmp/k8s/$1" "$tmp/broken/$1"; then fail "broken copy: '$2' changed nothing in $1"; fi
  render "$tmp/broken/overlays/$overlay" "$tmp/broken/out" || fail "broken copy: kustomize failed"
  local out
  out=$(node "$here/validate.js" --ps-launch "$ps_launch" "$tmp"/broken/out.*.yaml)
  local rc=$?
  if [[ $rc == 0 ]] || ! grep -qF -- "$3" <<<"$out"; then
    echo "$out"
    fail "broken copy ($1: $2) not reported as '$3'"
  fi
  step "broken copy caught: $1: $(grep -F -- "$3" <<<"$out" | head -1)"
}
broken cpu base/scheduler.yaml '1,/^---/ s/component: scheduler$/component: schedulr/' \
  'Service/ps-scheduler: selector'
broken cpu base/server.yaml '0,/key: token/ s/key: token/key: tokn/' \
  'Secret ps-auth'
broken cpu base/job.yaml 's/^  minibatch: 1000$/  minibatch: 0/' \
  'training.minibatch: must be >= 1'
broken cpu base/worker.yaml 's/^  completions: 2 /  completions: 3 /' \
  'completions 3 != cluster.num_workers 2'
broken tls overlays/tls/tls.yaml '0,/mountPath: \/etc\/paramserver\/tls/ s//mountPath: \/etc\/paramserver\/tlz/' \
  'env PS_TLS_CERT_FILE: /etc/paramserver/tls/tls.crt is on no volume'
echo "k8s_test: PASSED ($SECONDS s)"
