#!/usr/bin/env bash
# Build the kubevirt-rs test guest from Debian packages only.
#
# Usage: scripts/build-test-guest.sh [OUT_DIR]
#   OUT_DIR defaults to $XDG_CACHE_HOME/kubevirt-rs/guest (or ~/.cache/kubevirt-rs/guest).
#
# Outputs (the script does nothing when they already exist; FORCE=1 rebuilds):
#   vmlinux            uncompressed kernel ELF, booted by QEMU through its PVH entry
#                      (about 3 s faster than the bzImage under TCG)
#   vmlinuz            the same kernel as Debian ships it (bzImage), for bootloaders:
#                      scripts/build-test-guest-disk.sh puts it on the bootable disk image
#   initramfs.cpio.gz  busybox userland with an /init that
#                        - loads the virtio, ACPI button and filesystem modules,
#                        - runs busybox acpid so an ACPI power-button press (QMP
#                          system_powerdown) ends in `poweroff -f`,
#                        - runs `user-data` from an attached NoCloud `cidata` disk
#                          (vfat or iso9660) when it starts with `#!`,
#                        - prints GUEST-READY on the serial console,
#                        - onlines hotplugged CPUs and memory (the job udev does in a
#                          distribution) and, before GUEST-READY and after every CPU, memory or
#                          block device change, prints what it sees:
#                          GUEST-SEES cpus=<online list> mem=<MemTotal kB> disks=<vda,...>
#                        - answers console lines: ping -> PONG, run CMD -> output +
#                          RUN-DONE rc=N, poweroff, reboot,
#                        - starts Debian's QEMU guest agent (qemu-ga, package
#                          qemu-guest-agent) in the background before GUEST-READY when the
#                          guest has the virtio-serial port org.qemu.guest_agent.0 (see below),
#                        - mounts devpts on /dev/pts (PTYs for SSH sessions).
#   kernel.version     the kernel release the guest was built from
#
# Programs: qemu-ga, dropbear, dropbearkey, OpenSSH's sftp-server (what `scp` talks to since
# OpenSSH 9; dropbear runs /usr/lib/sftp-server), OpenBSD's netcat as /bin/nc.openbsd (UDP,
# which busybox's nc lacks) and exactly the shared libraries they load (glib,
# pcre2, libnuma, liburing, libudev for qemu-ga; libcrypt, libtomcrypt, libtommath, libgmp,
# zlib for dropbear; libc and the dynamic loader) come from the Debian packages, found per
# program by asking the packages' own dynamic loader what is still missing and fetching only
# the matching Depends; nothing is taken from the host.
#
# Guest agent: there is no udev, so /sbin/qga-start
# (run by /init after the modules are loaded, and by the uevent helper when the port's name
# arrives later) finds the port whose /sys/class/virtio-ports/*/name is
# org.qemu.guest_agent.0, links /dev/virtio-ports/org.qemu.guest_agent.0 to its /dev/vportNpM
# and runs `qemu-ga -d -m virtio-serial` on it (pidfile /run/qemu-ga.pid, state dir
# /run/qemu-ga, log /var/log/qemu-ga.log). Without the port nothing is started or printed.
#   /etc/os-release    ID=kubevirt-rs-test-guest, NAME="kubevirt-rs test guest", VERSION_ID=1
#                      (what guest-get-osinfo reports); the host name is testguest.
#   /sbin/shutdown     what qemu-ga's guest-shutdown execs (`shutdown -h -P|-H|-r +0 MSG`;
#                      busybox has no shutdown applet): prints
#                      GUEST-AGENT-SHUTDOWN powerdown|halt|reboot on the console, syncs and
#                      runs `poweroff -f` (-h/-P), `halt -f` (-H) or `reboot -f` (-r). The
#                      reboot resets the VM, so QEMU without -no-reboot boots the guest again.
#   /sbin/hwclock      busybox hwclock, for guest-set-time.
#   /usr/sbin/dropbear Debian's Dropbear SSH server (package dropbear-bin, with
#                      /usr/bin/dropbearkey); /init does not start it. Root (home /root,
#                      shell /bin/sh, no password) logs in with a key from
#                      /root/.ssh/authorized_keys. Start it from user-data, e.g.
#                        #!/bin/sh
#                        echo 'ssh-ed25519 AAAA... test' >/root/.ssh/authorized_keys
#                        /sbin/sshd-start
#                      or with `run /sbin/sshd-start` on the console (after the key is
#                      written the same way). /sbin/sshd-start creates /root/.ssh and
#                      /etc/dropbear, runs `dropbear -F -E -R -p 22` in the background (host
#                      keys generated in /etc/dropbear on first use, pidfile /run/dropbear.pid,
#                      log /var/log/dropbear.log), waits until port 22 listens and prints
#                      SSHD-READY on the console (SSHD-FAILED after 30 s); started twice it
#                      only waits and prints again. Needs tg.net=dhcp (or other networking).
#
# Boot it with at least 96 MiB of guest memory and `console=ttyS0`, e.g.
#   qemu-system-x86_64 -accel tcg -M q35 -m 128 -nodefaults -display none \
#     -kernel OUT/vmlinux -initrd OUT/initramfs.cpio.gz \
#     -append "console=ttyS0 panic=-1 quiet" -serial stdio
#
# Kernel cmdline switches understood by /init:
#   tg.net=dhcp   bring eth0 up with udhcpc and print NET-READY <ip>
#   tg.quiet=1    do not report modules that failed to load
#
# Environment: KERNEL_PACKAGE pins the kernel package (default: what linux-image-amd64
# depends on today); FORCE=1 rebuilds even when the outputs exist.
# Missing host tools (busybox-static, cpio, xz-utils, zstd) are installed with apt-get.
set -euo pipefail

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}
out=${1:-$cache_root/kubevirt-rs/guest}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The cache is valid for this version of the script only.
recipe=$(sha256sum "$0" | cut -d' ' -f1)
if [ -z "${FORCE:-}" ] && [ -s "$out/vmlinux" ] && [ -s "$out/vmlinuz" ] && [ -s "$out/initramfs.cpio.gz" ] &&
    [ "$(cat "$out/recipe.sha256" 2>/dev/null)" = "$recipe" ]; then
    echo "test guest already built in $out"
    exit 0
fi

log() { printf '==> %s\n' "$*" >&2; }

# ---------------------------------------------------------------- host tools
busybox_bin=/bin/busybox
missing=()
# A static busybox is needed: the initramfs has no libc.
if [ ! -x "$busybox_bin" ] || ldd "$busybox_bin" >/dev/null 2>&1; then missing+=(busybox-static); fi
command -v cpio >/dev/null || missing+=(cpio)
command -v xz >/dev/null || missing+=(xz-utils)
command -v zstd >/dev/null || missing+=(zstd)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; then
        apt-get update -qq
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

scratch=$(mktemp -d -t kubevirt-rs-guest.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# ---------------------------------------------------------------- kernel
kernel_package=${KERNEL_PACKAGE:-}
if [ -z "$kernel_package" ]; then
    kernel_package=$(apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)
    if [ -z "$kernel_package" ]; then
        apt-get update -qq
        kernel_package=$(apt-cache depends linux-image-amd64 |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)
    fi
fi
[ -n "$kernel_package" ] || { echo "cannot find the Debian kernel package" >&2; exit 1; }
log "downloading $kernel_package"
(cd "$scratch" && apt-get download "$kernel_package" >/dev/null 2>&1)
deb=$(find "$scratch" -maxdepth 1 -name 'linux-image-*.deb' | head -n1)
dpkg-deb -x "$deb" "$scratch/pkg"
kver=$(ls "$scratch/pkg/lib/modules")
modroot="$scratch/pkg/lib/modules/$kver"

# The bzImage carries the kernel as one compressed stream; find its magic and unpack
# the ELF behind it.
unpack_elf() {
    local image=$1 dest=$2 offset
    for magic in '\xfd7zXZ\x00:xz -dcq --single-stream' '\x28\xb5\x2f\xfd:zstd -dcq'; do
        local pattern=${magic%%:*} tool=${magic#*:}
        offset=$(LC_ALL=C grep -obUaP "$pattern" "$image" | head -n1 | cut -d: -f1 || true)
        [ -n "$offset" ] || continue
        tail -c "+$((offset + 1))" "$image" | $tool >"$dest" 2>/dev/null || true
        if [ "$(head -c 4 "$dest" | od -An -c | tr -d ' ')" = '177ELF' ]; then return 0; fi
    done
    return 1
}
log "extracting vmlinux from kernel $kver"
unpack_elf "$scratch/pkg/boot/vmlinuz-$kver" "$scratch/vmlinux" ||
    { echo "could not extract an ELF kernel from vmlinuz-$kver" >&2; exit 1; }

# ---------------------------------------------------------------- modules
# Debian ships no modules.dep; busybox depmod writes one.
"$busybox_bin" depmod -b "$scratch/pkg" "$kver"
wanted="virtio_pci virtio_blk virtio_net virtio_console virtio_rng virtio_scsi virtio_mem sd_mod sr_mod
        button evdev isofs vfat nls_cp437 nls_ascii"
declare -A picked=()
add_module() {
    local name=${1//-/_} entry file deps dep
    entry=$(grep -E "/(${name}|${name//_/-})\.ko(\.xz|\.zst)?:" "$modroot/modules.dep" | head -n1 || true)
    [ -n "$entry" ] || return 0 # built in or absent from this flavour
    file=${entry%%:*}
    deps=${entry#*:}
    [ -z "${picked[$file]:-}" ] || return 0
    picked[$file]=1
    for dep in $deps; do add_module "$(basename "${dep%%.ko*}")"; done
}
for m in $wanted; do add_module "$m"; done

# ---------------------------------------------------------------- guest programs
# qemu-ga and dropbear are dynamically linked. Fetch a program's package, then ask the dynamic
# loader (from the fetched libc6 once there is one) which libraries it cannot find in the
# fetched packages; for each, fetch the Depends of the package whose file needs it -- only the
# one named after the library (libpcre2-8.so.0 -> libpcre2-8-0) when there is such a Depends,
# all of its Depends otherwise -- and ask again. A library the loader finds on the host
# counts as missing, so the result does not depend on what the host has installed. This is
# done for each program in turn; the initramfs gets the union of their libraries.
debs="$scratch/debs"
mkdir -p "$debs"
declare -A fetched=()
fetch_package() {
    local pkg=$1 deb
    fetched[$pkg]=1
    log "downloading $pkg"
    mkdir -p "$debs/$pkg.deb.d"
    if ! (cd "$debs/$pkg.deb.d" && apt-get download "$pkg" >/dev/null 2>&1); then
        apt-get update -qq
        (cd "$debs/$pkg.deb.d" && apt-get download "$pkg" >/dev/null 2>&1)
    fi
    deb=$(find "$debs/$pkg.deb.d" -maxdepth 1 -name '*.deb' | head -n1)
    [ -n "$deb" ] || { echo "cannot download $pkg" >&2; exit 1; }
    dpkg-deb -x "$deb" "$debs/$pkg"
}
# tree_file TREE PATH: the file PATH names inside the extracted package TREE, following
# symlinks (absolute ones too) inside the tree.
tree_file() {
    local tree=$1 file=$1$2 target n=0
    while [ -L "$file" ] && [ $n -lt 40 ]; do
        target=$(readlink "$file")
        case $target in /*) file=$tree$target ;; *) file=$(dirname "$file")/$target ;; esac
        n=$((n + 1))
    done
    printf '%s\n' "$file"
}
package_depends() {
    apt-cache depends "$1" 2>/dev/null |
        sed -n 's/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: \([^ <>]*\)$/\2/p' | sort -u
}
squash() { printf '%s' "$1" | tr -d '.-' | tr '[:upper:]' '[:lower:]'; }
# The dynamic loader in the fetched libc6 (/lib64 before the /usr merge, /usr/lib64 after).
libc6_loader() {
    local path file
    for path in /lib64/ld-linux-x86-64.so.2 /usr/lib64/ld-linux-x86-64.so.2; do
        file=$(tree_file "$debs/libc6" "$path")
        if [ -f "$file" ]; then printf '%s\n' "$file"; return 0; fi
    done
    return 1
}
# resolve_libraries PROGRAM: fetch packages until the loader finds every library PROGRAM (a
# file in an extracted package) loads in the fetched packages, then add its
# "soname path" pairs to $scratch/libs.list.
resolve_libraries() {
    local bin=$1 name round loader libpath missing= soname needer owner stem dep rest
    local -a wanted fallback
    name=$(basename "$bin")
    for round in $(seq 1 30); do
        loader=/lib64/ld-linux-x86-64.so.2
        if [ -n "${fetched[libc6]:-}" ]; then loader=$(libc6_loader); fi
        libpath=$(find "$debs" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u | paste -sd:)
        # What ldd does (`ld.so --list` gives up at the first missing library instead).
        LD_TRACE_LOADED_OBJECTS=1 LD_DEBUG=files "$loader" --library-path "$libpath" "$bin" \
            >"$scratch/ld.list" 2>"$scratch/ld.debug" || true
        # "soname => path (address)" or "soname => not found" lines; the loader's own line
        # starts with a /.
        missing=$(awk -v debs="$debs/" '$2 == "=>" && $1 !~ /^\// && index($3, debs) != 1 { print $1 }' "$scratch/ld.list")
        [ -n "$missing" ] || break
        wanted=() fallback=()
        for soname in $missing; do
            needer=$(sed -n "s/^.*file=${soname//./\\.} \[0\]; *needed by \(.*\) \[0\]\$/\1/p" "$scratch/ld.debug" | head -n1)
            case $needer in "$debs"/*) ;; *) continue ;; esac # needed by a host library for now
            owner=${needer#"$debs"/}
            owner=${owner%%/*}
            stem=$(squash "${soname%%.so*}")
            for dep in $(package_depends "$owner"); do
                [ -z "${fetched[$dep]:-}" ] || continue
                fallback+=("$dep")
                rest=$(squash "$dep")
                rest=${rest#"$stem"}
                if [ "$rest" != "$(squash "$dep")" ] && [[ $rest =~ ^[0-9]*$ ]]; then wanted+=("$dep"); fi
            done
        done
        [ ${#wanted[@]} -gt 0 ] || wanted=("${fallback[@]}")
        if [ ${#wanted[@]} -eq 0 ]; then
            echo "no Debian package found for the $name libraries: $(echo $missing)" >&2
            exit 1
        fi
        for dep in $(printf '%s\n' "${wanted[@]}" | sort -u); do
            [ -n "${fetched[$dep]:-}" ] || fetch_package "$dep"
        done
    done
    [ -z "$missing" ] || { echo "$name libraries still missing: $(echo $missing)" >&2; exit 1; }
    awk '$2 == "=>" && $1 !~ /^\// { print $1, $3 }' "$scratch/ld.list" >>"$scratch/libs.list"
}
# The programs the guest gets, as "PACKAGE PATH [optional]"; each is installed at PATH.
guest_programs=(
    "qemu-guest-agent /usr/sbin/qemu-ga"
    "dropbear-bin /usr/sbin/dropbear"
    "dropbear-bin /usr/bin/dropbearkey optional"
    "openssh-sftp-server /usr/lib/openssh/sftp-server"
    "netcat-openbsd /bin/nc.openbsd"
)
declare -A installed=() # path in the guest -> file in an extracted package
: >"$scratch/libs.list"
for entry in "${guest_programs[@]}"; do
    read -r pkg path need <<<"$entry"
    [ -n "${fetched[$pkg]:-}" ] || fetch_package "$pkg"
    bin=$(tree_file "$debs/$pkg" "$path")
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
        if [ "$need" = optional ]; then log "$pkg has no $path; left out"; continue; fi
        echo "$pkg has no $path" >&2
        exit 1
    fi
    resolve_libraries "$bin"
    installed[$path]=$bin
done
libc6_loader >/dev/null || { echo "no dynamic loader in the fetched libc6" >&2; exit 1; }

# ---------------------------------------------------------------- initramfs tree
root="$scratch/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc/acpi/PWRF,proc,sys,dev,tmp,run,mnt,var/log}
mkdir -p "$root/lib/modules/$kver"
cp "$busybox_bin" "$root/bin/busybox"
for applet in $("$busybox_bin" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
for file in "${!picked[@]}"; do
    dest="$root/lib/modules/$kver/${file%.xz}"
    dest=${dest%.zst}
    mkdir -p "$(dirname "$dest")"
    case $file in
    *.xz) xz -dc "$modroot/$file" >"$dest" ;;
    *.zst) zstd -dcq "$modroot/$file" >"$dest" ;;
    *) cp "$modroot/$file" "$dest" ;;
    esac
done
cp "$modroot/modules.builtin" "$root/lib/modules/$kver/" 2>/dev/null || true
"$busybox_bin" depmod -b "$root" "$kver"

# The guest programs, their libraries in the loader's default directory, and the loader itself.
mkdir -p "$root/lib/x86_64-linux-gnu" "$root/lib64"
for path in "${!installed[@]}"; do
    mkdir -p "$(dirname "$root$path")"
    cp "${installed[$path]}" "$root$path"
    chmod 0755 "$root$path"
done
sort -u "$scratch/libs.list" | while read -r soname path; do
    rel=${path#"$debs"/}
    cp "$(tree_file "$debs/${rel%%/*}" "/${rel#*/}")" "$root/lib/x86_64-linux-gnu/$soname"
done
cp "$(libc6_loader)" "$root/lib64/ld-linux-x86-64.so.2"
chmod 0755 "$root/lib64/ld-linux-x86-64.so.2"
ln -s ../run "$root/var/run"
ln -s ../bin/busybox "$root/sbin/hwclock" # guest-set-time runs /sbin/hwclock
ln -s openssh/sftp-server "$root/usr/lib/sftp-server" # where Debian's dropbear runs it

cat >"$root/etc/os-release" <<'EOF'
NAME="kubevirt-rs test guest"
ID=kubevirt-rs-test-guest
VERSION_ID=1
VERSION="1 (busybox)"
PRETTY_NAME="kubevirt-rs test guest 1 (busybox, Debian kernel)"
VARIANT="busybox initramfs"
VARIANT_ID=initramfs
EOF

# Accounts for dropbear (root logs in with a key only: no password is set) and the tty group
# that owns PTYs.
cat >"$root/etc/passwd" <<'EOF'
root:*:0:0:root:/root:/bin/sh
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
tty:x:5:
EOF
echo /bin/sh >"$root/etc/shells"
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
mkdir -p "$root/root/.ssh" "$root/etc/dropbear"
chmod 0700 "$root/root" "$root/root/.ssh" "$root/etc/dropbear"

# Start dropbear on port 22 (once; later calls only wait), host keys made on first use.
cat >"$root/sbin/sshd-start" <<'EOF'
#!/bin/sh
# Usage: sshd-start -- root logs in with a key from /root/.ssh/authorized_keys.
mkdir -p /root/.ssh /etc/dropbear /dev/pts
chmod 0700 /root /root/.ssh /etc/dropbear
[ -e /dev/pts/ptmx ] || mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
pid=$(cat /run/dropbear.pid 2>/dev/null)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    # -F -E with setsid and & rather than dropbear's own fork, so its log is kept.
    setsid /usr/sbin/dropbear -F -E -R -p 22 -P /run/dropbear.pid \
        </dev/null >>/var/log/dropbear.log 2>&1 &
fi
# Listening on port 22 (0x16), IPv4 or IPv6.
n=0
until grep -qE '^ *[0-9]+: [0-9A-F]+:0016 [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    n=$((n + 1))
    if [ $n -gt 300 ]; then
        echo "SSHD-FAILED" >/dev/console
        tail -n 5 /var/log/dropbear.log >/dev/console 2>/dev/null
        exit 1
    fi
    sleep 0.1
done
echo "SSHD-READY" >/dev/console
EOF

cat >"$root/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
echo "ACPI-POWER-BUTTON" >/dev/console
sync
poweroff -f
EOF

# busybox uevent runs this for every kernel uevent: online what was hotplugged, then say what the
# guest sees. Block devices are listed from /sys/block (there is no udev to make nodes).
cat >"$root/sbin/hotplug" <<'EOF'
#!/bin/sh
case "$SUBSYSTEM:$ACTION" in
virtio-ports:add | virtio-ports:change) exec /sbin/qga-start ;; # the name comes with a change
cpu:add) [ -w "/sys$DEVPATH/online" ] && echo 1 >"/sys$DEVPATH/online" ;;
memory:add) [ "$(cat "/sys$DEVPATH/state" 2>/dev/null)" = offline ] && echo online >"/sys$DEVPATH/state" ;;
block:add | block:remove | cpu:remove | memory:remove) ;;
*) exit 0 ;;
esac
[ -e /tmp/guest-ready ] || exit 0
# One report per burst of events: a later event's report replaces a pending one.
echo $$ >/tmp/hotplug.latest
sleep 1
[ "$(cat /tmp/hotplug.latest)" = $$ ] || exit 0
/sbin/guest-sees >/dev/console
EOF

cat >"$root/sbin/guest-sees" <<'EOF'
#!/bin/sh
disks=$(ls /sys/block | grep -E '^(vd|sd|sr)' | tr '\n' ',' | sed 's/,$//')
mem=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)
echo "GUEST-SEES cpus=$(cat /sys/devices/system/cpu/online) mem=$mem disks=$disks"
EOF

# Start qemu-ga once, on the virtio-serial port named org.qemu.guest_agent.0 (if any).
cat >"$root/sbin/qga-start" <<'EOF'
#!/bin/sh
name=org.qemu.guest_agent.0
for file in /sys/class/virtio-ports/*/name; do
    [ "$(cat "$file" 2>/dev/null)" = "$name" ] || continue
    port=${file%/name}
    port=${port##*/}
    [ -c "/dev/$port" ] || exit 0
    mkdir /run/qemu-ga 2>/dev/null || exit 0 # already started
    mkdir -p /dev/virtio-ports
    ln -sfn "../$port" "/dev/virtio-ports/$name"
    exec /usr/sbin/qemu-ga -d -m virtio-serial -p "/dev/virtio-ports/$name" \
        -f /run/qemu-ga.pid -t /run/qemu-ga -l /var/log/qemu-ga.log
done
exit 0
EOF

# qemu-ga's guest-shutdown execs `/sbin/shutdown -h -P|-H|-r +0 "hypervisor initiated shutdown"`
# with stdio on /dev/null. PID 1 is a plain shell, so go to the kernel directly.
cat >"$root/sbin/shutdown" <<'EOF'
#!/bin/sh
mode=powerdown
for arg; do
    case $arg in
    -r | --reboot) mode=reboot ;;
    -H | --halt) [ $mode = reboot ] || mode=halt ;;
    esac
done
echo "GUEST-AGENT-SHUTDOWN $mode" >/dev/console
sync
case $mode in
reboot) reboot -f ;;
halt) halt -f ;;
*) poweroff -f ;;
esac
EOF

cat >"$root/etc/udhcpc.script" <<'EOF'
#!/bin/sh
[ "$1" = bound ] || [ "$1" = renew ] || exit 0
ip addr add "$ip/${mask:-24}" dev "$interface"
[ -z "$router" ] || ip route add default via "${router%% *}" dev "$interface"
echo "NET-READY $ip" >/dev/console
EOF

cat >"$root/init" <<'EOF'
#!/bin/sh
# PID 1 of the kubevirt-rs test guest: a plain shell, so power off with `poweroff -f`.
PATH=/bin:/sbin:/usr/bin:/usr/sbin
export PATH
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts
mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs tmpfs /tmp
cmdline=$(cat /proc/cmdline)
option() { for word in $cmdline; do case $word in "$1"=*) echo "${word#*=}" ;; esac; done; }
# Memory a virtio-mem device plugs later comes online by itself; CPUs are onlined by the
# uevent helper.
echo online >/sys/devices/system/memory/auto_online_blocks 2>/dev/null
# Before the modules: the uevent helper may start the guest agent as soon as its port
# appears, and glib keeps the host name the agent first asks for.
hostname testguest
uevent /sbin/hotplug &
for m in virtio_pci virtio_blk virtio_net virtio_console virtio_rng virtio_scsi virtio_mem sd_mod sr_mod \
         button evdev isofs vfat nls_cp437 nls_ascii; do
    modprobe -q "$m" 2>/dev/null || [ -n "$(option tg.quiet)" ] || echo "guest: module $m not loaded"
done
ip link set lo up
# The guest agent, when there is an org.qemu.guest_agent.0 port (a port named later is
# picked up by /sbin/hotplug).
/sbin/qga-start &
stty -echo 2>/dev/null
acpid -c /etc/acpi -l /var/log/acpid.log

if [ "$(option tg.net)" = dhcp ]; then
    ip link set eth0 up && udhcpc -i eth0 -q -n -t 10 -T 1 -s /etc/udhcpc.script >/dev/null 2>&1 &
fi

# NoCloud: a vfat or iso9660 disk (labelled cidata) carrying meta-data and user-data.
# Debian's busybox has no blkid, so every disk is tried for the two files instead.
mkdir -p /mnt/cidata
for dev in /dev/vd? /dev/sd? /dev/sr?; do
    [ -b "$dev" ] || continue
    mount -o ro "$dev" /mnt/cidata 2>/dev/null || continue
    [ -f /mnt/cidata/meta-data ] || { umount /mnt/cidata; continue; }
    if [ -f /mnt/cidata/user-data ] && head -n1 /mnt/cidata/user-data | grep -q '^#!'; then
        cp /mnt/cidata/user-data /tmp/user-data && chmod +x /tmp/user-data
        /tmp/user-data; echo "USER-DATA-DONE rc=$?"
    fi
    break
done

echo "UPTIME: $(cut -d' ' -f1 /proc/uptime)"
/sbin/guest-sees
echo "GUEST-READY"
touch /tmp/guest-ready
while :; do
    if read -r cmd rest; then
        case $cmd in
        ping) echo PONG ;;
        run) sh -c "$rest"; echo "RUN-DONE rc=$?" ;;
        poweroff) sync; poweroff -f ;;
        reboot) sync; reboot -f ;;
        '') ;;
        *) echo "UNKNOWN $cmd" ;;
        esac
    else
        sleep 3600 # no console input (serial to a file)
    fi
done
EOF
chmod 0755 "$root/init" "$root/etc/acpi/PWRF/00000080" "$root/etc/udhcpc.script" "$root/sbin/hotplug" "$root/sbin/guest-sees" \
    "$root/sbin/qga-start" "$root/sbin/shutdown" "$root/sbin/sshd-start"

log "packing initramfs (${#picked[@]} modules)"
(cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet | gzip -9) >"$scratch/initramfs.cpio.gz"

# Publish atomically so an interrupted build never looks finished.
mv "$scratch/vmlinux" "$out/vmlinux.tmp" && mv "$out/vmlinux.tmp" "$out/vmlinux"
cp "$scratch/pkg/boot/vmlinuz-$kver" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$scratch/initramfs.cpio.gz" "$out/initramfs.cpio.gz.tmp" &&
    mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
echo "$kver" >"$out/kernel.version"
echo "$recipe" >"$out/recipe.sha256"
echo "test guest: $out (kernel $kver)"
