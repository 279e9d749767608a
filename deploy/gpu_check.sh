#!/usr/bin/env bash
# Runs the GPU checks on a machine that has an NVIDIA GPU but not this
# project's Debian packages (the device tool's machines: CUDA, cuBLAS and
# cuDNN, no gRPC, Abseil or protobuf, no network).
#
#   deploy/gpu_check.sh bundle BUILD_DIR OUT_DIR   # here: binaries + libs
#   deploy/gpu_check.sh run BUNDLE_DIR [RESULTS]   # there: tests, bench, jobs
#
# `bundle` copies, stripped, what the GPU checks run (the gpu-labelled
# cuda_backend_test, the CUDA end-to-end tests, kernel_bench, the
# processes of a job and libps_cuda.so) with the non-system shared libraries
# they link, the criteo-10k data the MLP tests read, and this script. `run`
# runs, on the GPU, each test binary, kernel_bench, and the quick-start job
# (processes over gRPC) on the CPU backend and on the CUDA one, and exits
# non-zero if any of them failed. The CUDA libraries come from the machine:
# /usr/local/cuda, else the Python wheels (nvidia-cublas, nvidia-cudnn...).
set -euo pipefail

mode=${1:?usage: gpu_check.sh bundle BUILD OUT | run BUNDLE [RESULTS]}

if [[ $mode == bundle ]]; then
  build=${2:?build dir}
  out=${3:?output dir}
  [[ -f $build/bin/libps_cuda.so ]] ||
    { echo "gpu_check: $build has no bin/libps_cuda.so (built without CUDA?)" >&2; exit 1; }
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/data"
  bins=(
    "$build/kernels/cuda_backend_test" "$build/kernels/mlp_test"
    "$build/kernels/backend_test" "$build/kernels/kernel_bench"
    "$build/worker/mlp_trainer_test" "$build/tests/local_cluster_test"
    "$build/bin/ps_launch" "$build/bin/ps_scheduler" "$build/bin/ps_server"
    "$build/bin/ps_worker" "$build/bin/libps_cuda.so")
  for b in "${bins[@]}"; do
    strip -o "$out/bin/$(basename "$b")" "$b"
  done
  # Every library the binaries link, except the C and C++ runtimes (the
  # machine's are newer) and CUDA's (the machine's match its driver).
  for b in "${bins[@]}"; do ldd "$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libcudnn|/libnv' |
    while read -r lib; do cp -L "$lib" "$out/lib/"; done
  src=$(cd "$(dirname "$0")/.." && pwd)
  data="$src/../shared/data/criteo-10k"
  if [[ -d $data ]]; then cp -r "$data" "$out/data/"; fi
  cp "$src/deploy/configs/quickstart.yaml" "$src/deploy/configs/criteo_mlp.yaml" \
    "$0" "$out/"
  du -sh "$out"
  exit 0
fi

[[ $mode == run ]] || { echo "gpu_check: unknown mode $mode" >&2; exit 2; }
bundle=$(cd "${2:?bundle dir}" && pwd)
results=${3:-$bundle/results}
mkdir -p "$results"
nvidia-smi -L || true

# CUDA's libraries: the toolkit's folders, then every wheel's lib folder.
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && cuda_dirs+="$d:"
done
while read -r so; do
  cuda_dirs+="$(dirname "$so"):"
done < <(find / -xdev \( -name 'libcudnn.so.9' -o -name 'libcublas.so.13' \
           -o -name 'libcudart.so.13' -o -name 'libcublasLt.so.13' \) \
           -not -path '/proc/*' 2>/dev/null | sort -u)
export LD_LIBRARY_PATH="$bundle/lib:${cuda_dirs%:}"
export PS_CUDA_LIBRARY="$bundle/bin/libps_cuda.so"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$PS_CUDA_LIBRARY" | grep -E 'not found|cu' || true

# The MLP tests read criteo-10k at $PS_SOURCE_DIR/../shared/data, the path
# the binaries were built with; recreate it when it is not there.
# (the test joins PS_SOURCE_DIR, "/../shared/data/" and the file's name).
base=$(strings "$bundle/bin/mlp_trainer_test" |
  awk '$0 == "/../shared/data/" {print prev; exit} {prev = $0}')
if [[ $base == /* && ! -d $base/../shared/data/criteo-10k &&
      -d $bundle/data/criteo-10k ]]; then
  mkdir -p "$base" "$base/../shared/data"
  cp -r "$bundle/data/criteo-10k" "$base/../shared/data/"
fi

failed=()
step() {  # step NAME COMMAND...: runs it, logs to RESULTS/NAME.log
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@" >"$results/$name.log" 2>&1; then
    if grep -q '^\[  SKIPPED \]' "$results/$name.log"; then
      # On a machine with a GPU, no GPU test may skip.
      echo "--- $name: SKIPPED tests ($((SECONDS - t0)) s)"
      failed+=("$name")
    else
      echo "--- $name: ok ($((SECONDS - t0)) s)"
    fi
  else
    echo "--- $name: FAILED rc=$? ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
  tail -n 25 "$results/$name.log"
}

step cuda_backend_test "$bundle/bin/cuda_backend_test"
step mlp_test "$bundle/bin/mlp_test"
step backend_test "$bundle/bin/backend_test"
step mlp_trainer_cuda "$bundle/bin/mlp_trainer_test" --gtest_filter='*Cuda*'
step local_cluster_cuda "$bundle/bin/local_cluster_test" --gtest_filter='*Cuda*'
step kernel_bench "$bundle/bin/kernel_bench"
# The LR gradient at a training job's minibatch sizes (rows x about 20
# non-zeros; the columns are the batch's distinct keys): where the GPU's
# fixed costs (launches, copies, a stream sync) stop outweighing the CPU's
# work. training.backend=auto's choice for LR rests on these figures.
for shape in "100 2000 2000" "1000 10000 1000" "10000 50000 200" \
    "100000 200000 40"; do
  read -r rows cols reps <<<"$shape"
  step "kernel_bench_lr_$rows" "$bundle/bin/kernel_bench" --rows "$rows" \
    --cols "$cols" --nnz 20 --reps "$reps" --mlp_batch 0
done
for backend in cpu cuda; do
  step "quickstart_$backend" /usr/bin/time -v "$bundle/bin/ps_launch" \
    --config "$bundle/quickstart.yaml" --bin-dir "$bundle/bin" \
    --set "training.backend=$backend" \
    --set "output.model_dir=$results/model_$backend" \
    --run-dir "$results/run_$backend" --timeout_s 300 \
    --report "$results/report_$backend.json"
done
# The wide & deep MLP (criteo_mlp.yaml) over processes, 2 epochs, each backend.
if [[ -f $bundle/criteo_mlp.yaml && -d $bundle/data/criteo-10k ]]; then
  for backend in cpu cuda; do
    step "criteo_mlp_$backend" /usr/bin/time -v "$bundle/bin/ps_launch" \
      --config "$bundle/criteo_mlp.yaml" --bin-dir "$bundle/bin" \
      --set "training.backend=$backend" --set training.epochs=2 \
      --set "data.train=$bundle/data/criteo-10k/train.tsv" \
      --set "data.test=$bundle/data/criteo-10k/test.tsv" \
      --set "output.model_dir=$results/mlp_model_$backend" \
      --run-dir "$results/mlp_run_$backend" --timeout_s 300 \
      --report "$results/report_mlp_$backend.json"
  done
fi
for r in "$results"/report_*.json; do
  echo "$(basename "$r"): $(grep -o -E '"(status|test_auc|examples_per_sec|wall_seconds)": [^,]*' "$r" | tr '\n' ' ')"
done
# The CUDA kernels under compute-sanitizer's memcheck (out-of-bounds and
# misaligned accesses, leaks of device memory), where the machine has it.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n $sanitizer ]]; then
  step memcheck_cuda_backend_test "$sanitizer" --tool memcheck \
    --leak-check full --error-exitcode 3 "$bundle/bin/cuda_backend_test"
  step racecheck_cuda_backend_test "$sanitizer" --tool racecheck \
    --error-exitcode 3 "$bundle/bin/cuda_backend_test"
  # Reads of device memory never written, and the trainer's own CUDA path
  # (the MLP end to end) under memcheck.
  step initcheck_cuda_backend_test "$sanitizer" --tool initcheck \
    --error-exitcode 3 "$bundle/bin/cuda_backend_test"
  step memcheck_mlp_trainer_cuda timeout 240 "$sanitizer" --tool memcheck \
    --leak-check full --error-exitcode 3 "$bundle/bin/mlp_trainer_test" \
    --gtest_filter='*Cuda*'
fi

if ((${#failed[@]})); then
  echo "gpu_check: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu_check: all passed"
