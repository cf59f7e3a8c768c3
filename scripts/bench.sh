#!/usr/bin/env bash
# Benchmarks: builds the release binaries and prints figures (Markdown) for docs/benchmarks.md.
# Figures, never assertions: a shared two-core machine makes timings noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_toolchain
step "building benchmarks (release)"
cargo build --release --locked -p kubevirt-rs-bench -p kubevirt-rs

OUT="${BENCH_OUT:-$KUBEVIRT_RS_CACHE/bench-$(date +%Y%m%d-%H%M%S).md}"
{
  echo "## Run of $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo
  "$CARGO_TARGET_DIR/release/kubevirt-rs-bench" apiserver --objects "${BENCH_OBJECTS:-4000}"
} | tee "$OUT"
step "report written to $OUT"
