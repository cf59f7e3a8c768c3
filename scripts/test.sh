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
# Tests that boot a guest read it from here; they say why they skip when it is absent.
export KUBEVIRT_RS_TEST_GUEST="$KUBEVIRT_RS_CACHE/guest"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo nextest run"
cargo nextest run --workspace --locked --no-fail-fast

step "doc tests"
cargo test --workspace --doc --locked

step "all tests passed"
