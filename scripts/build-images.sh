#!/usr/bin/env bash
# Builds the container images of the components (images/<name>/Containerfile) without pulling
# anything: each image is FROM scratch, with a root filesystem assembled here from the release
# build of kubevirt-rs and files of Debian packages installed on this machine (with the shared
# libraries ldd names for every executable).
#
#   scripts/build-images.sh [--push REGISTRY] [--tag TAG] [IMAGE...]
#
# IMAGE: names under images/ (default: all). TAG: default the workspace version, the tag deploy/
# uses. REGISTRY: host[:port][/path] to push kubevirt-rs/<name>:<TAG> to, over plain HTTP or
# unverified TLS (e.g. 127.0.0.1:5000). Uses buildah with its vfs storage driver (as root; via
# sudo otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

push=""
tag=""
images=()
while [ $# -gt 0 ]; do
  case "$1" in
    --push) push="${2:?--push needs a registry}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a tag}"; shift 2 ;;
    -h | --help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) images+=("$1"); shift ;;
  esac
done

all=()
for dir in images/*/; do
  [ -f "$dir/Containerfile" ] && all+=("$(basename "$dir")")
done
[ ${#images[@]} -gt 0 ] || images=("${all[@]}")
for name in "${images[@]}"; do
  [ -f "images/$name/Containerfile" ] || { echo "no image $name (have: ${all[*]})" >&2; exit 2; }
done

# The version deploy/ tags its images with: the workspace's.
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
tag="${tag:-$version}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
buildah() { "${sudo[@]}" "$(type -P buildah)" --storage-driver vfs "$@"; }

# Build tools, and the packages whose files go into the images (see images/*/files).
apt_install buildah qemu-system-x86 qemu-utils seabios ipxe-qemu ovmf dosfstools mtools genisoimage iproute2 nftables passt
command -v cargo >/dev/null || { echo "cargo is missing: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }

step "cargo build --release -p kubevirt-rs"
cargo build --release -p kubevirt-rs --locked
binary="$CARGO_TARGET_DIR/release/kubevirt-rs"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# add PATH ROOT: copies host PATH to ROOT/PATH. Directories on the way are resolved (so a
# merged-/usr host's /lib/x/y lands in usr/lib/x/y, with ROOT/lib the same link as on the
# host); a symbolic link is kept and its target added too.
add() {
  local path="$1" root="$2" dir base
  dir="$(realpath -e "$(dirname "$path")")"
  base="$(basename "$path")"
  path="$dir/$base"
  [ -e "$root$path" ] || [ -L "$root$path" ] && return 0
  mkdir -p "$root$dir"
  if [ -L "$path" ]; then
    cp -P "$path" "$root$path"
    local target
    target="$(readlink "$path")"
    case "$target" in /*) ;; *) target="$dir/$target" ;; esac
    add "$target" "$root"
  elif [ -d "$path" ]; then
    cp -a "$path" "$root$dir/"
    # Links inside the tree may point out of it.
    while IFS= read -r link; do
      local target
      target="$(readlink -f "$link")"
      [ -e "$target" ] && add "$target" "$root"
    done < <(find "$path" -type l)
  else
    cp -p "$path" "$root$path"
  fi
}

# add_elf PATH ROOT: PATH and every library ldd names for it (with the dynamic loader).
add_elf() {
  add "$1" "$2"
  add_libs "$1" "$2"
}

# add_libs PATH ROOT: the libraries ldd names for PATH.
add_libs() {
  local path="$1" root="$2" lib
  if ldd "$path" 2>&1 | grep -q 'not found'; then
    echo "$path: libraries not found:" >&2
    ldd "$path" | grep 'not found' >&2
    exit 1
  fi
  for lib in $(ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
    add "$lib" "$root"
  done
}

# rootfs NAME ROOT: the root filesystem of image NAME.
rootfs() {
  local name="$1" root="$2" top kind rest glob path paths
  mkdir -p "$root"
  # The host's top-level links (/bin -> usr/bin, /lib -> usr/lib… on a merged-/usr system).
  for top in /bin /sbin /lib /lib32 /lib64 /libx32; do
    [ -L "$top" ] && cp -P "$top" "$root$top"
  done
  mkdir -p "$root/etc" "$root/tmp" "$root/var/tmp" "$root/run"
  chmod 1777 "$root/tmp" "$root/var/tmp"
  # root; nonroot-user (1001) as upstream's virt-api, virt-controller and virt-operator run;
  # qemu (107) as upstream's non-root launcher runs QEMU.
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
qemu:x:107:107:qemu:/var/lib/qemu:/sbin/nologin
nonroot-user:x:1001:1001:nonroot-user:/home/nonroot-user:/sbin/nologin
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
qemu:x:107:
nonroot-user:x:1001:
EOF
  mkdir -p "$root/usr/bin"
  # Without the line tables of the release profile (a quarter of the size).
  strip --strip-debug -o "$root/usr/bin/kubevirt-rs" "$binary"
  add_libs "$binary" "$root"
  if [ "$name" = virt-launcher ]; then
    # The launcher's programs are the small virt-launcher binary built beside kubevirt-rs,
    # under each of its names.
    strip --strip-debug -o "$root/usr/bin/virt-launcher" "$(dirname "$binary")/virt-launcher"
    ln -s virt-launcher "$root/usr/bin/virt-tail"
    ln -s virt-launcher "$root/usr/bin/virt-probe"
    add_libs "$(dirname "$binary")/virt-launcher" "$root"
  fi
  [ -f "images/$name/files" ] || return 0
  while read -r kind rest; do
    case "$kind" in '' | '#'*) continue ;; esac
    for glob in $rest; do
      mapfile -t paths < <(compgen -G "$glob")
      [ ${#paths[@]} -gt 0 ] || { echo "images/$name/files: nothing matches $glob" >&2; exit 1; }
      for path in "${paths[@]}"; do
        case "$kind" in
          elf) add_elf "$path" "$root" ;;
          file | tree) add "$path" "$root" ;;
          *) echo "images/$name/files: unknown entry $kind" >&2; exit 1 ;;
        esac
      done
    done
  done <"images/$name/files"
}

declare -A seconds
for name in "${images[@]}"; do
  step "image kubevirt-rs/$name:$tag"
  start=$SECONDS
  context="$work/$name"
  rootfs "$name" "$context/rootfs"
  cp "images/$name/Containerfile" "$context/Containerfile"
  buildah bud --isolation chroot --quiet \
    --build-arg VERSION="$tag" --build-arg REVISION="$revision" \
    -f "$context/Containerfile" -t "kubevirt-rs/$name:$tag" "$context" >/dev/null
  if [ -n "$push" ]; then
    step "pushing $push/kubevirt-rs/$name:$tag"
    buildah push --tls-verify=false --quiet "kubevirt-rs/$name:$tag" \
      "docker://${push%/}/kubevirt-rs/$name:$tag"
  fi
  rm -rf "$context"
  seconds[$name]=$((SECONDS - start))
done

step "images"
for name in "${images[@]}"; do
  size="$(buildah images --format '{{.Size}}' "kubevirt-rs/$name:$tag" | head -1)"
  printf '%-40s %10s  %3ss\n' "kubevirt-rs/$name:$tag" "$size" "${seconds[$name]}"
done
