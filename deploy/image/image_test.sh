#!/bin/bash
# The container image's test (ctest -L image): builds the image with
# build.sh from this build's binaries, checks the OCI archive (oci_check.py:
# index, manifest, config, every blob's sha256 and size, the layers'
# diff_ids), unpacks its layer into a fresh root, and runs the quick-start
# job there with the image's own binaries and libraries (chroot, as the
# image's user 65532, in a private mount and pid namespace), smaller so it
# is quick. The report must say ok.
#
#   image_test.sh --build-dir BUILD --work BUILD/image-test
#
# Needs root (mmdebstrap, chroot) and the Debian mirror; exits 77 (ctest:
# skipped) when either is missing. The .debs are kept in
# BUILD/image-cache/apt, so later runs download only the package lists.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=
work=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "image_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $build && -n $work ]] || {
  echo "usage: image_test.sh --build-dir BUILD --work DIR" >&2
  exit 2
}
skip() { echo "image_test: SKIPPED: $*"; exit 77; }
fail() { echo "image_test: FAILED: $*"; exit 1; }
step() { echo "image_test: $* ($SECONDS s)"; }

[[ $(id -u) == 0 ]] || skip "needs root (mmdebstrap's root mode, chroot)"
command -v unshare >/dev/null && command -v chroot >/dev/null ||
  skip "needs unshare and chroot (util-linux, coreutils)"
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
root=$work/root
cleanup() { rm -rf "$root"; }
trap cleanup EXIT

step "building the image (deploy/image/build.sh)"
"$here/build.sh" --build-dir "$build" --out "$work" --tag test \
  --cache "$build/image-cache/apt" >"$work/build.log" 2>&1
rc=$?
if [[ $rc != 0 ]]; then
  tail -20 "$work/build.log"
  if [[ $rc == 4 ]]; then
    skip "this build links libraries outside Debian packages (CUDA); the image is made from -DPS_ENABLE_CUDA=OFF builds"
  fi
  if grep -qE "Failed to fetch|Temporary failure resolving|Could not resolve|Unable to fetch|Connection failed|Network is unreachable|Unable to locate package mmdebstrap|E: Package 'mmdebstrap' has no installation candidate" \
       "$work/build.log"; then
    skip "the Debian mirror cannot be reached (see $work/build.log)"
  fi
  fail "build.sh failed (see $work/build.log)"
fi
grep "^build.sh:" "$work/build.log"
archive=$work/paramserver-test.oci.tar
[[ -s $archive ]] || fail "build.sh wrote no $archive"

step "checking the OCI archive and unpacking its layer"
python3 "$here/oci_check.py" "$archive" --tag test --unpack "$root" ||
  fail "the OCI archive is malformed"
[[ ! -e $root/usr/share/doc/bash/README ]] || fail "docs were not left out"

# in_image CMD...: runs CMD in the unpacked image as user 65532, with /dev,
# /proc and a /tmp of its own (all gone with the namespace).
in_image() {
  unshare --mount --pid --fork --kill-child -- bash -c '
    root=$1; shift
    mount --rbind /dev "$root/dev" && mount -t proc proc "$root/proc" &&
      mount -t tmpfs tmpfs "$root/tmp" &&
      exec chroot --userspec=65532:65532 "$root" "$@"' _ "$root" "$@"
}

# A sanitizer build's options (deploy/check.sh asan) are inherited by the
# job in the image, and a suppressions= file there names a path of this
# checkout, which the image does not have: the instrumented binaries then
# refuse to start. Each such file is copied into the unpacked root and the
# option pointed at the copy.
for var in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
  opts=${!var:-}
  [[ $opts =~ (^|:)suppressions=([^:]+) ]] || continue
  src=${BASH_REMATCH[2]}
  [[ -r $src ]] || fail "$var names suppressions=$src, which cannot be read"
  dst=/etc/paramserver-sanitizer/${var%_OPTIONS}.supp
  install -D -m 0644 "$src" "$root$dst" || fail "copying $src into the image root"
  export "$var=${opts/suppressions=$src/suppressions=$dst}"
done

step "every library the binaries need is in the image"
for b in "$root"/usr/local/bin/ps_*; do
  out=$(in_image /usr/bin/ldd "/usr/local/bin/$(basename "$b")" 2>&1) ||
    fail "ldd $(basename "$b") in the image: $out"
  if grep -q "not found" <<<"$out"; then
    fail "$(basename "$b") in the image: $(grep 'not found' <<<"$out")"
  fi
done

step "ps_launch --check in the image"
in_image /usr/local/bin/ps_launch --check \
  --config /usr/local/share/paramserver/configs/quickstart.yaml ||
  fail "ps_launch --check rejects the image's quickstart.yaml"

step "the quick-start job in the image"
in_image /usr/local/bin/ps_launch --bin-dir /usr/local/bin \
  --config /usr/local/share/paramserver/configs/quickstart.yaml \
  --set data.synthetic.train_rows=200000 --set data.synthetic.test_rows=20000 \
  --set training.epochs=1 \
  --set output.model_dir=/var/lib/paramserver/model \
  --run-dir /var/lib/paramserver/run --timeout_s 240 >"$work/job.log" 2>&1
rc=$?
tail -5 "$work/job.log"
[[ $rc == 0 ]] || fail "the quick-start job exited $rc (see $work/job.log)"
report=$root/var/lib/paramserver/run/report.json
python3 - "$report" <<'EOF' || fail "the report is not a successful job's"
import json, sys
r = json.load(open(sys.argv[1]))
auc = r.get("test_auc", r.get("auc"))
print(f"image_test: report: status {r['status']}, test AUC {auc}")
assert r["status"] == "ok", r.get("error")
assert auc is not None and auc >= 0.7, auc
EOF
ls "$root"/var/lib/paramserver/model/* >/dev/null 2>&1 ||
  fail "no model files in /var/lib/paramserver/model"
step "PASSED"
