# Shared helpers for the project's scripts. Sourced, not executed.
# shellcheck shell=bash

# Keep the Cargo target directory outside the clone so a fresh clone (CI) reuses the cache.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/target}"
export KUBEVIRT_RS_CACHE="${KUBEVIRT_RS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs}"

step() { printf '\n==> %s\n' "$*"; }

# apt_install PKG...: installs the Debian packages that are missing (needs root or sudo).
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "installing Debian packages: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ensure_toolchain: cargo, rustfmt, clippy and cargo-nextest.
ensure_toolchain() {
  if ! command -v cargo >/dev/null; then
    echo "cargo is missing: install Rust with rustup (https://rustup.rs)" >&2
    exit 1
  fi
  if command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  fi
  if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest"
    cargo install --locked cargo-nextest
  fi
  if ! command -v cargo-machete >/dev/null; then
    step "installing cargo-machete"
    cargo install --locked cargo-machete
  fi
}

# ensure_runtime_packages: what tests and the server need on the host.
ensure_runtime_packages() {
  # qemu: the guests; dosfstools+mtools: cloud-init NoCloud disks; genisoimage: configMap,
  # secret and downwardAPI disks; ovmf: EFI firmware;
  # containernetworking-plugins+iproute2: pod network namespaces through the CNI plugins;
  # nftables: the service proxy (cluster IPs to endpoints); docker-registry: a real OCI
  # registry on loopback for the containerDisk pull tests; openssh-client: `virtctl ssh`/`scp`
  # run the system's ssh and scp; passt: the passt network binding; syslinux (with
  # dosfstools+mtools): the test guest's bootable disk image (scripts/build-test-guest-disk.sh);
  # qemu-utils: qemu-img, which the embedded CDI's importer converts qcow2 images with.
  apt_install qemu-system-x86 qemu-utils busybox-static cpio xz-utils zstd curl ca-certificates dosfstools mtools genisoimage \
    ovmf containernetworking-plugins iproute2 nftables docker-registry openssh-client passt syslinux
  command -v kubectl >/dev/null || install_kubectl
}

install_kubectl() {
  step "installing kubectl"
  apt_install kubernetes-client || {
    echo "kubectl is missing and could not be installed from Debian; install kubectl 1.32 and retry" >&2
    exit 1
  }
}
