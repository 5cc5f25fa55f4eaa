#!/usr/bin/env bash
# Boot the lab VM (scripts/vm/build-image.sh: Debian 12, its kernel with openvswitch.ko), run the
# project's set-up inside it and then one command from the repository's root, and exit with the
# command's exit code (or the set-up's, if that failed).
#
#   scripts/vm/run.sh [--io DIR] [--timeout SECONDS] [--accel auto|kvm|tcg] [--cpus N] [--memory MB] -- COMMAND...
#
# The repository is shared in (9p) at the path it has here, so the set-up run inside finds and
# reuses this machine's .venv (both are Debian 12's python3); DIR (default: a new temporary
# folder) is shared as /mnt/io: the command can write results there, and output.log and rc are
# left in it. The disk is a snapshot: nothing a run does inside persists. The VM has no network.
# KVM is used where it works, software emulation (TCG) otherwise: tried once per host kernel
# and remembered (/var/cache/fabric-emu/vm/accel-<release>); a KVM guest that prints nothing
# within a minute is taken as hanging (measured on our CI machine).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=/var/cache/fabric-emu/vm
io="" timeout_s=1800 accel=auto cpus=2 memory=6144
while [ $# -gt 0 ]; do
  case "$1" in
    --io) io=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "error: run.sh: unknown option $1 (see the comment at the top of scripts/vm/run.sh)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "error: run.sh: no command (usage: run.sh [options] -- COMMAND...)" >&2; exit 2; }
case "$accel" in auto|kvm|tcg) ;; *) echo "error: run.sh: --accel: auto, kvm or tcg, not $accel" >&2; exit 2 ;; esac
if [ "$(id -u)" -ne 0 ]; then
  echo "error: $(basename "$0") must run as root (the 9p share passes file ownership through)" >&2
  exit 2
fi
if ! command -v qemu-system-x86_64 >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
# The VM reuses this machine's .venv (it has no network to build one): make it current first.
bash "$here/scripts/setup.sh" >&2
image=$(bash "$here/scripts/vm/build-image.sh")
own_io=""
if [ -z "$io" ]; then io=$(mktemp -d /tmp/fabric-emu-vm-io.XXXXXX); own_io=1; fi
mkdir -p "$io"
rm -f "$io/rc" "$io/output.log"

# boot ACCEL TIMEOUT CMD...: one boot running CMD; 0 when the VM ran it (whatever its exit code).
boot() {
  local how=$1 limit=$2
  shift 2
  printf '%q ' "$@" > "$io/cmd.sh"
  local machine=(-accel tcg,thread=multi -cpu max)
  if [ "$how" = kvm ]; then machine=(-accel kvm -cpu host); fi
  rm -f "$io/rc"
  timeout --foreground -k 5 "$limit" qemu-system-x86_64 "${machine[@]}" -smp "$cpus" -m "$memory" \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 quiet panic=-1 init=/sbin/fabric-emu-vm-init fe.repo=$here" \
    -drive "file=$image/rootfs.ext4,format=raw,if=virtio,snapshot=on" \
    -virtfs "local,path=$here,mount_tag=repo,security_model=passthrough,id=repo" \
    -virtfs "local,path=$io,mount_tag=io,security_model=passthrough,id=io" \
    -nic none -display none -monitor none -serial stdio -no-reboot < /dev/null || true
  [ -f "$io/rc" ]
}

remembered="$cache/accel-$(uname -r)"
if [ "$accel" = auto ]; then
  if [ -f "$remembered" ]; then
    accel=$(cat "$remembered")
  elif [ -w /dev/kvm ] && boot kvm 60 true >/dev/null 2>&1; then
    accel=kvm
  else
    accel=tcg
  fi
  echo "$accel" > "$remembered"
fi
echo "[vm] booting Debian 12 ($(cut -d' ' -f2 "$image/done")) under $([ "$accel" = kvm ] && echo KVM || echo 'software emulation (TCG)'), $cpus CPUs, $memory MB" >&2
started=$(date +%s)
if ! boot "$accel" "$timeout_s" "$@"; then
  echo "error: the VM stopped before the command finished, or took longer than ${timeout_s} s (its console is above)" >&2
  exit 1
fi
rc=$(cat "$io/rc")
echo "[vm] the command exited $rc; the VM ran $(( $(date +%s) - started )) s${own_io:+; output in $io}" >&2
exit "$rc"
