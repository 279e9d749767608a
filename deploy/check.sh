#!/usr/bin/env bash
# Tooling that finds bugs before users do (docs/tooling.md):
#   deploy/check.sh tsa    clang-14 build, -Wthread-safety as an error (build-clang)
#   deploy/check.sh asan   ASan+UBSan unit and in-process tests (build-asan)
#   deploy/check.sh tsan   ThreadSanitizer unit and in-process tests (build-tsan)
#   deploy/check.sh fuzz   each libFuzzer target for PS_FUZZ_SECONDS (build-asan)
#   deploy/check.sh all    all four, in that order
# Only the test targets are built (*_test except the multi-process and GPU
# ones); ctest skips the labels multiprocess, gpu and slurm (and the
# placeholders gtest_discover_tests leaves for targets not built). Each build
# directory is configured once and then rebuilt incrementally (ccache when
# installed). Environment: PS_BUILD_JOBS (default nproc), PS_FUZZ_SECONDS
# (default 60 per target), PS_FUZZ_TARGETS (default: all eight).
# Exit status: non-zero on the first failing step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${PS_BUILD_JOBS:-$(nproc)}"
CC=clang-14
CXX=clang++-14

# Debian packages these modes need beyond deploy/install_deps.sh.
need_clang() {
  local missing=()
  for p in clang-14 libclang-rt-14-dev libfuzzer-14-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if ((${#missing[@]})); then
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \
      --no-install-recommends "${missing[@]}"
  fi
}

# configure <build dir> <cmake args...>
configure() {
  local dir="$1"
  shift
  CC=$CC CXX=$CXX cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPS_ENABLE_CUDA=OFF "$@" >/dev/null
}

# The unit and in-process test targets: every *_test target but the
# multi-process and GPU ones.
test_targets() {
  cmake --build "$ROOT/$1" --target help | awk '{print $2}' |
    grep -E '_test$' | grep -vE '^(multiprocess_test|cuda_backend_test)$'
}

# run_tests <build dir> [extra excluded labels, e.g. "|grpc"]
#           [extra excluded test names, e.g. "|OverGrpc"]
run_tests() {
  local dir="$1"
  local skip="${2:-}"
  local skip_names="${3:-}"
  # shellcheck disable=SC2046
  cmake --build "$ROOT/$dir" -j "$JOBS" --target $(test_targets "$dir")
  (cd "$ROOT/$dir" && ctest --output-on-failure --timeout 600 -j "${PS_TEST_JOBS:-2}" \
    -LE "multiprocess|gpu|slurm$skip" -E "_NOT_BUILT\$$skip_names")
}

step_tsa() {
  need_clang
  # -O0: this build only checks, nothing runs.
  configure build-clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
    -DPS_WERROR_THREAD_SAFETY=ON
  cmake --build "$ROOT/build-clang" -j "$JOBS"
}

# One ASan+UBSan build serves both the tests and the fuzz targets
# (PS_FUZZ=ON adds only libFuzzer's coverage instrumentation).
configure_asan() {
  configure build-asan -DPS_FUZZ=ON
}

step_asan() {
  need_clang
  configure_asan
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  export LSAN_OPTIONS="suppressions=$ROOT/tools/lsan.supp"
  run_tests build-asan
}

step_tsan() {
  need_clang
  configure build-tsan -DPS_SANITIZE=thread
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tools/tsan.supp"
  # Not the gRPC-label tests: the Debian gRPC (and the absl Cord/Status
  # refcounts it passes between its threads) is not instrumented, and TSan
  # reports its internals (docs/tooling.md). Our code in them is covered
  # by the in-process tests and by asan. Nor the image and prometheus
  # tests: they run the product binaries (ps_launch and its children),
  # which do not carry tools/tsan_absl_shim.cc (only test executables
  # link it), so every absl::Mutex-guarded access there reads as a race
  # (e.g. ProcessGroup::new_streams_, always under mu_). Nor, for the
  # same reason as the grpc label, the tests named OverGrpc in otherwise
  # in-process binaries (SchedulerCoreTest.SessionOverGrpcOpensAndCloses:
  # TSan reported a memcpy in libupb of a Cord that gRPC's thread made).
  run_tests build-tsan "|grpc|image|prometheus" "|OverGrpc"
}

step_fuzz() {
  need_clang
  configure_asan
  local targets="${PS_FUZZ_TARGETS:-libsvm criteo config server scheduler wire dataplane files replica}"
  local secs="${PS_FUZZ_SECONDS:-60}"
  local t
  # shellcheck disable=SC2086
  cmake --build "$ROOT/build-asan" -j "$JOBS" --target $(printf 'fuzz_%s ' $targets)
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  for t in $targets; do
    # New inputs go to a scratch corpus; the seeds in fuzz/corpus stay as
    # committed. Crashes land in build-asan/crashes/.
    local work="$ROOT/build-asan/corpus/$t"
    mkdir -p "$work" "$ROOT/build-asan/crashes"
    echo "== fuzz_$t for ${secs}s"
    "$ROOT/build-asan/bin/fuzz_$t" "$work" "$ROOT/fuzz/corpus/$t" \
      -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="$ROOT/build-asan/crashes/$t-" \
      2>&1 | grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' || {
      echo "fuzz_$t found a crash: see build-asan/crashes/$t-*" >&2
      return 1
    }
  done
}

mode="${1:-all}"
case "$mode" in
  tsa | asan | tsan | fuzz)
    start=$SECONDS
    "step_$mode"
    echo "check.sh $mode: ok in $((SECONDS - start)) s"
    ;;
  all)
    for m in tsa asan tsan fuzz; do
      start=$SECONDS
      "step_$m"
      echo "check.sh $m: ok in $((SECONDS - start)) s"
    done
    ;;
  *)
    echo "usage: $0 [tsa|asan|tsan|fuzz|all]" >&2
    exit 2
    ;;
esac
