#!/usr/bin/env bash
# Quick start (2): install, build, and run the whole test suite with ctest.
# Extra arguments go to ctest (e.g. -R Consistency, -L multiprocess).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/deploy/build.sh"
cd "$ROOT/build"
ctest --output-on-failure --timeout 600 -j "${PS_TEST_JOBS:-2}" "$@"
