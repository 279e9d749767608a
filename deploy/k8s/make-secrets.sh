#!/bin/bash
# Writes the secret files the Kubernetes manifests are generated from (never
# committed; see the .gitignore files):
#   base/secrets/token                 the cluster token (PS_AUTH_TOKEN)
#   overlays/tls/secrets/{ca.crt,tls.crt,tls.key}
#                                      a CA and one node certificate (server
#                                      and client use) naming ps-scheduler
#                                      and *.ps-server of the namespace
# Usage: deploy/k8s/make-secrets.sh [--namespace NS] [--dir K8S_DIR] [--force]
# Existing files are kept unless --force. Needs openssl.
set -euo pipefail

namespace=default
dir=$(cd "$(dirname "$0")" && pwd)
force=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --namespace) namespace=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "make-secrets.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v openssl >/dev/null || {
  echo "make-secrets.sh: openssl is needed (apt-get install openssl)" >&2
  exit 1
}
umask 077

token_file=$dir/base/secrets/token
if [[ $force == 1 || ! -s $token_file ]]; then
  mkdir -p "$(dirname "$token_file")"
  openssl rand -hex 16 | tr -d '\n' > "$token_file"
  echo "make-secrets.sh: wrote $token_file"
fi

tls=$dir/overlays/tls/secrets
if [[ $force == 1 || ! -s $tls/tls.crt ]]; then
  mkdir -p "$tls"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$work/ca.key" -out "$tls/ca.crt" -days 365 \
    -subj "/CN=paramserver CA ($namespace)" 2>/dev/null
  svc=$namespace.svc
  san="DNS:ps-scheduler,DNS:ps-scheduler.$svc,DNS:ps-scheduler.$svc.cluster.local"
  san+=",DNS:*.ps-scheduler.$svc,DNS:*.ps-scheduler.$svc.cluster.local"
  san+=",DNS:ps-server.$svc,DNS:*.ps-server.$svc,DNS:*.ps-server.$svc.cluster.local"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$tls/tls.key" -out "$work/node.csr" \
    -subj "/CN=paramserver node ($namespace)" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" \
    > "$work/ext"
  openssl x509 -req -in "$work/node.csr" -CA "$tls/ca.crt" \
    -CAkey "$work/ca.key" -CAcreateserial -CAserial "$work/ca.srl" -days 365 -extfile "$work/ext" \
    -out "$tls/tls.crt" 2>/dev/null
  echo "make-secrets.sh: wrote $tls/{ca.crt,tls.crt,tls.key} for namespace $namespace"
fi
