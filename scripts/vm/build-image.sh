#!/usr/bin/env bash
# Build the lab VM's disk image, kernel and initrd from Debian 12's packages, through this
# machine's own apt sources (no image is downloaded), and print the folder that holds them.
#
#   scripts/vm/build-image.sh [--print-dir]
#
# The image holds exactly the packages scripts/setup.sh installs (`setup.sh --apt-packages
# debian`), plus a kernel (whose package ships openvswitch.ko) and an init that hands over to
# the shared repository's scripts/vm/init.sh, so the set-up run inside the VM finds its
# packages installed, as on a Vagrant box provisioned by the same script. Cached under
# /var/cache/fabric-emu/vm/<key>, the key a hash of the package list and of this script: a
# change to either builds anew;
# older images are removed. Needs root, mmdebstrap and e2fsprogs (installed if missing).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=/var/cache/fabric-emu/vm
suite=bookworm
log() { printf '[vm-image] %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "error: $(basename "$0") must run as root (it builds a root filesystem)" >&2
  exit 2
fi

packages=$(bash "$here/scripts/setup.sh" --apt-packages debian | tr '\n' ',')
# The VM's own: a kernel (and the initrd that loads virtio and ext4), 9p for the shared repository.
packages+="linux-image-amd64,initramfs-tools,udev,ca-certificates"
key=$( { echo "$suite $packages"; cat "$here/scripts/vm/build-image.sh"; } | sha256sum | cut -c1-16)
out="$cache/$key"
if [ -f "$out/done" ]; then
  echo "$out"
  exit 0
fi

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

rm -rf "$cache"/*/  # older images (a key is a whole image: nothing in them is reused)
mkdir -p "$out"
work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
sources=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  if [ -s "$f" ]; then sources=$f; break; fi
done
[ -n "$sources" ] || { echo "error: no apt sources on this machine (/etc/apt/sources.list{,.d})" >&2; exit 1; }
log "root filesystem: Debian $suite from $sources ($(echo "$packages" | tr ',' ' ' | wc -w) packages)"
start=$(date +%s)
# PID 1 of the image: it mounts the shared repository and hands over to the repository's own
# scripts/vm/init.sh, so a change there needs no new image.
cat > "$work/stub" <<'STUB'
#!/bin/sh
mount -t proc proc /proc
repo=$(tr " " "\n" < /proc/cmdline | sed -n "s/^fe\.repo=//p")
modprobe 9pnet_virtio; modprobe 9p
mkdir -p "$repo" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 repo "$repo"
exec /bin/bash "$repo/scripts/vm/init.sh"
STUB
# The answer setup.sh gives (tshark: no setuid capture). mmdebstrap keeps the packages' services
# from starting in the chroot; in the VM, the set-up script starts Open vSwitch.
mmdebstrap --variant=apt --include="$packages" \
  --essential-hook='echo "wireshark-common wireshark-common/install-setuid boolean false" | chroot "$1" debconf-set-selections' \
  --customize-hook='rm -f "$1/etc/machine-id" && : > "$1/etc/machine-id"' \
  --customize-hook="install -m 0755 '$work/stub' \"\$1/sbin/fabric-emu-vm-init\"" \
  --customize-hook='echo fabric-emu-vm > "$1/etc/hostname"' \
  --customize-hook='printf "127.0.0.1 localhost\n127.0.1.1 fabric-emu-vm\n" > "$1/etc/hosts"' \
  "$suite" "$root" "$sources" >"$work/mmdebstrap.log" 2>&1 || {
    tail -20 "$work/mmdebstrap.log" >&2
    echo "error: mmdebstrap failed (log above)" >&2
    exit 1
  }
log "root filesystem built in $(( $(date +%s) - start )) s"
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
size_mb=$(( $(du -sm "$root" | cut -f1) + 1024 ))  # room for the run's files and the BPF cache
mkfs.ext4 -q -F -L fabric-emu-vm -d "$root" "$work/rootfs.ext4" "${size_mb}M" >&2
mv "$work/vmlinuz" "$work/initrd.img" "$work/rootfs.ext4" "$out/"
echo "$suite $(basename "$(ls "$root"/boot/vmlinuz-*)")" > "$out/done"
log "image: $out ($(du -sh "$out" | cut -f1), $(( $(date +%s) - start )) s)"
echo "$out"
