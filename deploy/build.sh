#!/usr/bin/env bash
# Configures and builds the project into build/ (installing missing Debian
# packages first). Extra arguments go to `cmake --build` (e.g. a --target).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/deploy/install_deps.sh"
JOBS="${PS_BUILD_JOBS:-$(nproc)}"
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$ROOT/build" -j "$JOBS" "$@"
