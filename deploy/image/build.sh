#!/bin/bash
# Builds the container image from Debian packages, not from a downloaded
# base image: mmdebstrap makes a minimal Debian 12 root file system (the
# Essential packages and the runtime libraries the binaries link, found with
# ldd and dpkg -S), the project's binaries go to /usr/local/bin and
# deploy/configs to /usr/local/share/paramserver/configs, and umoci wraps it
# as an OCI image (one layer; user 65532, the uid the Kubernetes manifests
# run as), written as an OCI archive:
#
#   deploy/image/build.sh [--build-dir build] [--out BUILD/image] [--tag latest]
#   -> OUT/paramserver-TAG.oci.tar (image paramserver:TAG), OUT/rootfs.tar
#
# Load it with `podman load -i OUT/paramserver-TAG.oci.tar`, or push it:
#   skopeo copy oci-archive:OUT/paramserver-TAG.oci.tar:TAG \
#     docker://REGISTRY/paramserver:TAG
# Options:
#   --build-dir DIR  the CMake build holding bin/ps_* (default: build)
#   --out DIR        where the archive goes (default: BUILD/image)
#   --tag TAG        the image tag (default: latest; the k8s manifests use
#                    paramserver:latest, overlays/gpu paramserver:cuda)
#   --cache DIR      keeps the downloaded .debs between builds (default:
#                    BUILD/image-cache/apt)
#   --mirror URL     the Debian mirror (default: http://deb.debian.org/debian)
# Needs root (mmdebstrap's root mode; run as root it also installs mmdebstrap
# and umoci when missing) and the Debian mirror. Binaries linking a library
# no Debian package holds (a CUDA toolkit under /usr/local) are refused with
# exit status 4: build with -DPS_ENABLE_CUDA=OFF.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
build=$src/build
out=
tag=latest
cache=
mirror=http://deb.debian.org/debian
suite=bookworm
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
out=${out:-$build/image}
cache=${cache:-$build/image-cache/apt}
# The package lists too: apt then only checks they are current.
lists=$cache-lists
mkdir -p "$out" "$cache" "$lists"
out=$(cd "$out" && pwd)
cache=$(cd "$cache" && pwd)
lists=$(cd "$lists" && pwd)
say() { echo "build.sh: $*"; }

# --- Tools (Debian packages) ---------------------------------------------------
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
if (( ${#missing[@]} > 0 )); then
  if [[ $(id -u) != 0 ]]; then
    say "needs ${missing[*]} (apt-get install ${missing[*]}); run as root to install them"
    exit 3
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi

# --- What goes in: the binaries and the packages of the libraries they link ----
bins=()
for name in ps_launch ps_scheduler ps_server ps_worker ps_status ps_predict; do
  [[ -x $build/bin/$name ]] && bins+=("$build/bin/$name")
done
for name in ps_launch ps_scheduler ps_server ps_worker; do
  [[ -x $build/bin/$name ]] || {
    say "$build/bin/$name is missing: build it first (cmake --build $build)"
    exit 3
  }
done
declare -A packages=()
while read -r lib; do
  pkg=
  for candidate in "$lib" "$(readlink -f "$lib")" "/usr$lib"; do
    pkg=$(dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1) && [[ -n $pkg ]] && break
  done
  if [[ -z $pkg ]]; then
    say "$lib (linked by the binaries) belongs to no Debian package; build with -DPS_ENABLE_CUDA=OFF or leave it out"
    exit 4
  fi
  packages[$pkg]=1
done < <(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
# usr-is-merged: else apt satisfies init-system-helpers' "usrmerge |
# usr-is-merged" with usrmerge, which pulls in all of perl.
packages[usr-is-merged]=1
include=$(printf '%s\n' "${!packages[@]}" | sort | paste -sd, -)
say "runtime packages: $include"

# --- The root file system ------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/share"
cp "${bins[@]}" "$stage/bin/"
# Without their debug sections (a third of a RelWithDebInfo binary); symbols
# stay for backtraces.
if command -v strip >/dev/null; then strip --strip-debug "$stage"/bin/*; fi
cp -r "$src/deploy/configs" "$stage/share/configs"
rootfs=$out/rootfs.tar
# Fixed timestamps: the same inputs give the same layer.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$src" log -1 --format=%ct 2>/dev/null || echo 0)}
say "mmdebstrap $suite (apt cache $cache)"
mmdebstrap --variant=essential --include="$include" \
  --skip=essential/unlink \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt=force-unsafe-io \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --setup-hook='mkdir -p "$1"/var/cache/apt/archives/ "$1"/var/lib/apt/lists/' \
  --setup-hook="sync-in $cache /var/cache/apt/archives/" \
  --setup-hook="sync-in $lists /var/lib/apt/lists/" \
  --customize-hook="sync-out /var/cache/apt/archives $cache" \
  --customize-hook="sync-out /var/lib/apt/lists $lists" \
  --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
  --customize-hook="copy-in $stage/bin /usr/local" \
  --customize-hook='mkdir -p "$1"/usr/local/share/paramserver' \
  --customize-hook="copy-in $stage/share/configs /usr/local/share/paramserver" \
  --customize-hook='echo "paramserver:x:65532:65532:paramserver:/var/lib/paramserver:/usr/sbin/nologin" >> "$1"/etc/passwd' \
  --customize-hook='echo "paramserver:x:65532:" >> "$1"/etc/group' \
  --customize-hook='mkdir -p "$1"/var/lib/paramserver && chown 65532:65532 "$1"/var/lib/paramserver' \
  --customize-hook='chown -R 0:0 "$1"/usr/local && chmod -R a+rX,go-w "$1"/usr/local' \
  "$suite" "$rootfs" "$mirror"

# --- The OCI image -----------------------------------------------------------------------
layout=$stage/oci
say "OCI image paramserver:$tag"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci raw add-layer --image "$layout:$tag" \
  --history.created "$created" --history.created_by "deploy/image/build.sh" \
  --history.comment "mmdebstrap $suite: essential + $include; ps_* binaries" \
  "$rootfs"
umoci config --image "$layout:$tag" --created "$created" \
  --config.user 65532:65532 \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin \
  --config.workingdir /var/lib/paramserver \
  --config.cmd /usr/local/bin/ps_launch --config.cmd --help \
  --config.label org.opencontainers.image.title=paramserver \
  --config.label "org.opencontainers.image.revision=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)" \
  --history.created "$created" --history.created_by "umoci config"
umoci gc --layout "$layout"
archive=$out/paramserver-$tag.oci.tar
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$layout" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
say "wrote $archive ($(du -h "$archive" | cut -f1)); root file system in $rootfs"
