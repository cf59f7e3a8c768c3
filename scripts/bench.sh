#!/usr/bin/env bash
# Benchmarks: builds the release binaries and prints figures (Markdown) for docs/benchmarks.md.
# Figures, never assertions: a shared two-core machine makes timings noisy.
#
#   BENCH_OBJECTS   API server creates per measurement (default 4000)
#   BENCH_VMS       fake-QEMU batch, paced and all at once; label sync (default 100)
#   BENCH_SCALE_VMS fake-QEMU control-plane scale batches, comma-separated, each on a server of
#                   its own with a node per 200 VMs (default 1000)
#   BENCH_KWOK=1    also upstream's KWOK scale: 8000 fake-QEMU VMs (40 nodes; long)
#   BENCH_REAL_VMS  real QEMU guests per batch (default 2: at most two QEMUs at once)
#   BENCH_OUT       report path;  BENCH_PLOT  creation→Running CDF (PNG)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_toolchain
ensure_runtime_packages
apt_install fonts-dejavu-core  # labels of the plot
step "building benchmarks (release)"
cargo build --release --locked -p kubevirt-rs-bench -p kubevirt-rs
step "building the test guest (cached)"
scripts/build-test-guest.sh "$KUBEVIRT_RS_CACHE/guest"

STAMP="$(date +%Y%m%d-%H%M%S)"
OUT="${BENCH_OUT:-$KUBEVIRT_RS_CACHE/bench-$STAMP.md}"
PLOT="${BENCH_PLOT:-$KUBEVIRT_RS_CACHE/bench-$STAMP-cdf.png}"
BENCH="$CARGO_TARGET_DIR/release/kubevirt-rs-bench"
{
  echo "## Run of $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB," \
    "$( [ -w /dev/kvm ] && echo "/dev/kvm present (the accelerator QEMU used is named below)" || echo "no /dev/kvm (TCG)")"
  echo
  echo "### API server"
  echo
  "$BENCH" apiserver --objects "${BENCH_OBJECTS:-4000}"
  echo
  "$BENCH" vms \
    --vms "${BENCH_VMS:-100}" \
    --scale-vms "${BENCH_SCALE_VMS:-1000}${BENCH_KWOK:+,8000}" \
    --real-vms "${BENCH_REAL_VMS:-2}" \
    --guest-dir "$KUBEVIRT_RS_CACHE/guest" \
    --plot "$PLOT"
} | tee "$OUT"
step "report written to $OUT, plot to $PLOT"
