#!/usr/bin/env bash
# The project's test command: installs what is missing, then runs formatting, lints,
# every test (unit, integration, end-to-end with real kubectl and QEMU under TCG) and
# the doc tests. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_toolchain
ensure_runtime_packages

step "building the test guest (cached)"
scripts/build-test-guest.sh "$KUBEVIRT_RS_CACHE/guest"
step "building the test guest's bootable disk image (cached)"
scripts/build-test-guest-disk.sh "$KUBEVIRT_RS_CACHE/guest"
# Tests that boot a guest read it from here.
export KUBEVIRT_RS_TEST_GUEST="$KUBEVIRT_RS_CACHE/guest"
# Everything a test needs (QEMU, the guest, virtctl, mkfs.vfat…) is installed above, so here a
# missing prerequisite fails its test instead of skipping it (see crates/test-prerequisites).
export KUBEVIRT_RS_REQUIRE_PREREQUISITES=1

step "cargo fmt --check"
cargo fmt --all -- --check

step "unused dependencies (cargo machete)"
cargo machete

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo nextest run"
cargo nextest run --workspace --locked --no-fail-fast

step "doc tests"
cargo test --workspace --doc --locked

step "all tests passed"
