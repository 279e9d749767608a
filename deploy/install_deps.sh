#!/usr/bin/env bash
# Installs the Debian 12 packages the project needs. Idempotent: installs only
# what is missing, so a second run costs one dpkg query.
set -euo pipefail
PKGS=(build-essential cmake pkg-config
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libspdlog-dev libyaml-cpp-dev libgtest-dev libgmock-dev
      libgoogle-perftools-dev libjemalloc-dev
      libcpp-httplib-dev
      libzstd-dev liblz4-dev  # push compression (filters.codec)
      iperf3 python3 openssl
      iproute2  # the network-partition test (ip netns, veth)
      python3-matplotlib)  # ps_launch --plot, bench/lr_benchmark.py plots
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
