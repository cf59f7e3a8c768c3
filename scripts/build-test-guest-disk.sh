#!/usr/bin/env bash
# Build a bootable raw disk image of the kubevirt-rs test guest, from Debian packages only and
# without mounting anything (no loop devices, no root needed).
#
# Usage: scripts/build-test-guest-disk.sh [GUEST_DIR]
#   GUEST_DIR is what scripts/build-test-guest.sh built (it needs vmlinuz and
#   initramfs.cpio.gz there); it defaults to $XDG_CACHE_HOME/kubevirt-rs/guest (or
#   ~/.cache/kubevirt-rs/guest), as for that script.
#
# Output (nothing is done when it is already built from the same script and the same guest
# files; FORCE=1 rebuilds):
#   GUEST_DIR/disk.img  a partitionless ("superfloppy") FAT image whose sector 0 is the FAT
#                       boot record with SYSLINUX's boot code, which SeaBIOS (QEMU's BIOS
#                       firmware, what a VM without kernelBoot or EFI boots) boots like a disk
#                       with an MBR. It holds
#                         ldlinux.sys, ldlinux.c32  SYSLINUX (Debian package syslinux)
#                         syslinux.cfg              boots the entry below at once, no prompt
#                         vmlinuz                   the guest's Debian kernel (bzImage)
#                         initramfs.cpio.gz         the guest's initramfs
#                       booted with `console=ttyS0 panic=-1 quiet tg.quiet=1`: the console
#                       shows SYSLINUX's banner, then what the test guest prints (GUEST-READY,
#                       cloud-init NoCloud user data it runs, ...; see build-test-guest.sh).
#   GUEST_DIR/disk.recipe.sha256  what the image was built from (this script and the inputs)
#
# The guest's /init tries every disk for NoCloud files; this one has none, so a cidata disk
# attached beside it is still found. The image is what a containerDisk carries under /disk/;
# by hand:
#   qemu-system-x86_64 -accel tcg -M q35 -m 128 -nodefaults -display none \
#     -drive file=GUEST_DIR/disk.img,format=raw,if=virtio -serial stdio
# Under TCG it reaches GUEST-READY about 3.5 s later than the kernelBoot of vmlinux (the
# bzImage decompresses itself, SYSLINUX reads the files through the BIOS). BIOS only: OVMF
# (EFI firmware) does not boot it.
#
# Missing host tools (dosfstools, mtools, syslinux) are installed with apt-get.
set -euo pipefail

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}
guest=${1:-$cache_root/kubevirt-rs/guest}
guest=$(cd "$guest" && pwd)
for file in vmlinuz initramfs.cpio.gz; do
    [ -s "$guest/$file" ] || { echo "$guest has no $file (run scripts/build-test-guest.sh $guest)" >&2; exit 1; }
done

# Valid for this version of the script and these guest files only.
recipe=$(cat "$0" "$guest/vmlinuz" "$guest/initramfs.cpio.gz" | sha256sum | cut -d' ' -f1)
if [ -z "${FORCE:-}" ] && [ -s "$guest/disk.img" ] &&
    [ "$(cat "$guest/disk.recipe.sha256" 2>/dev/null)" = "$recipe" ]; then
    echo "test guest disk already built: $guest/disk.img"
    exit 0
fi

log() { printf '==> %s\n' "$*" >&2; }

missing=()
command -v mkfs.vfat >/dev/null || [ -x /usr/sbin/mkfs.vfat ] || [ -x /sbin/mkfs.vfat ] || missing+=(dosfstools)
command -v mcopy >/dev/null || missing+=(mtools)
command -v syslinux >/dev/null || missing+=(syslinux)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; then
        apt-get update -qq
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi
PATH=$PATH:/usr/sbin:/sbin

scratch=$(mktemp -d -t kubevirt-rs-guest-disk.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# SERIAL: SYSLINUX says what it does (or why it cannot boot) on the serial console, where
# nothing else would before the kernel.
cat >"$scratch/syslinux.cfg" <<'EOF'
SERIAL 0 115200
DEFAULT guest
PROMPT 0
TIMEOUT 0
LABEL guest
  LINUX /vmlinuz
  INITRD /initramfs.cpio.gz
  APPEND console=ttyS0 panic=-1 quiet tg.quiet=1
EOF

# The files, SYSLINUX (about 180 KiB) and the FAT's own tables, plus 2 MiB, in whole MiB.
bytes=$(($(stat -c %s "$guest/vmlinuz") + $(stat -c %s "$guest/initramfs.cpio.gz")))
mib=$(((bytes * 11 / 10 + (1 << 20) - 1) / (1 << 20) + 2))
log "making a ${mib} MiB FAT image"
image="$scratch/disk.img"
truncate -s "${mib}M" "$image"
# --invariant: a fixed volume ID and dates, so the same inputs give the same image.
mkfs.vfat --invariant -n TESTGUEST "$image" >/dev/null
export MTOOLS_SKIP_CHECK=1
mcopy -i "$image" "$guest/vmlinuz" "$guest/initramfs.cpio.gz" "$scratch/syslinux.cfg" ::/
# Writes ldlinux.sys and ldlinux.c32 through mtools and SYSLINUX's boot code into the FAT
# boot record (sector 0).
syslinux --install "$image"
[ "$(od -An -tx1 -j 510 -N 2 "$image" | tr -d ' ')" = 55aa ] ||
    { echo "$image has no boot signature in sector 0" >&2; exit 1; }

mv "$image" "$guest/disk.img.tmp" && mv "$guest/disk.img.tmp" "$guest/disk.img"
echo "$recipe" >"$guest/disk.recipe.sha256"
echo "test guest disk: $guest/disk.img (${mib} MiB)"
