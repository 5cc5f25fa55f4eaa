#!/usr/bin/env bash
# Idempotent set-up for fabric-emu on Debian 12 / Ubuntu 24.04, run as root (or via sudo).
# Installs the system packages, starts Open vSwitch for the userspace datapath and builds
# the Python virtual environment (.venv) with pinned dependencies. Safe to run repeatedly:
# each step checks whether it is already done.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$here/.venv"
stamp_dir=/var/lib/fabric-emu
apt_stamp="$stamp_dir/apt.done"

log() { printf '[setup] %s\n' "$*" >&2; }

# The system packages, for Debian (12) or Ubuntu (24.04). `setup.sh --apt-packages [debian|ubuntu]`
# prints them, one a line, and exits: the lab VM's image (scripts/vm/build-image.sh) is built
# with exactly these, so the set-up run inside it finds them installed.
apt_packages_for() {
  local distro=$1
  local pkgs=(
    mininet openvswitch-switch openvswitch-common
    iperf3 ethtool tcpdump tshark iputils-ping iproute2 procps kmod
    clang llvm libbpf-dev linux-libc-dev
    python3 python3-venv python3-dev git
    prometheus  # the metrics integration test runs its own server (the service is not started)
    # Several machines (issue 19): Mininet Cluster Edition drives its servers over ssh and runs
    # their commands through sudo; the tests stand two servers up on this machine, each with its
    # own sshd (tests/integration/servers.py). The system-wide sshd is never started (below).
    openssh-server openssh-client sudo
  )
  # bpftool (loads the port programs) is its own package on Debian 12 but part of linux-tools on
  # Ubuntu 24.04, whose bpftool wrapper needs the tools of the running kernel's flavour.
  # Headless Chromium, in which the tests open `fabric-emu report` pages: Debian's own package;
  # Ubuntu's is chromium-browser (a snap underneath).
  if [ "$distro" = ubuntu ]; then pkgs+=(linux-tools-common linux-tools-generic chromium-browser)
  else pkgs+=(bpftool chromium); fi
  printf '%s\n' "${pkgs[@]}"
}
this_distro=debian
if grep -qi ubuntu /etc/os-release; then this_distro=ubuntu; fi
if [ "${1:-}" = "--apt-packages" ]; then
  apt_packages_for "${2:-$this_distro}"
  exit 0
fi

# Root is needed (Mininet, Open vSwitch); re-run through sudo when it exists.
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -- bash "$(readlink -f "${BASH_SOURCE[0]}")" "$@"; fi
  echo "error: $(basename "$0") must run as root (Mininet and Open vSwitch need it) and sudo is not installed" >&2
  exit 2
fi

mapfile -t apt_packages < <(apt_packages_for "$this_distro")

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer for it.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  # Debian's prometheus package would start a server on every address (:9090), and its
  # openssh-server an sshd on every address (:22); we only want the binaries (tests run their
  # own, on loopback or private addresses). Masking first keeps them from ever starting (ssh.socket:
  # Ubuntu 24.04 starts sshd by socket activation); they stay masked, so no boot starts them
  # either (`systemctl unmask ssh.service ssh.socket` to have a system-wide sshd after all).
  # Without systemd, the packages' init scripts would start them instead: a policy-rc.d that
  # refuses just those services, for the install only (and only if the machine has none).
  # Only for packages being installed now: an sshd the machine already runs (a Vagrant box's)
  # is left alone.
  policy=/usr/sbin/policy-rc.d
  own_policy=""
  refuse_units=() refuse_services=()
  if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    refuse_units+=(prometheus.service) refuse_services+=(prometheus)
  fi
  if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
    refuse_units+=(ssh.service ssh.socket) refuse_services+=(ssh sshd)
  fi
  if [ ${#refuse_units[@]} -gt 0 ]; then
    if [ -d /run/systemd/system ]; then
      systemctl mask "${refuse_units[@]}" >/dev/null 2>&1 || true
    elif [ ! -e "$policy" ]; then
      printf '#!/bin/sh\ncase "$1" in %s) exit 101 ;; esac\nexit 0\n' "$(IFS='|'; echo "${refuse_services[*]}")" > "$policy"
      chmod 755 "$policy"
      own_policy=1
    fi
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
  if [ -n "$own_policy" ]; then rm -f "$policy"; fi
  # A policy-rc.d the machine already had may have let the package's init script start sshd
  # anyway: stop exactly that one (the package's own pid file), it was started by this install.
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && [ ! -d /run/systemd/system ] && [ -s /run/sshd.pid ]; then
    log "stopping the system-wide sshd the openssh-server install started"
    start-stop-daemon --stop --quiet --oknodo --pidfile /run/sshd.pid --exec /usr/sbin/sshd || true
  fi
fi
mkdir -p "$stamp_dir" && touch "$apt_stamp"

# Socket buffers for Open vSwitch's userspace datapath. It reads each switch port through an
# AF_PACKET socket and writes to all of them through ONE shared socket, to which every packet
# waiting in any port's egress queue is charged: with the kernel's 208 KB default, OVS starts
# discarding packets (uncounted) once ~25 jumbo frames are queued anywhere in the fabric.
# Sockets take these defaults when created, so they must be set before ovs-vswitchd starts.
sysctl_conf=/etc/sysctl.d/60-fabric-emu.conf
want_wmem=$((64 * 1024 * 1024))
want_rmem=$((8 * 1024 * 1024))
if [ ! -f "$sysctl_conf" ]; then
  log "raising socket buffer defaults for Open vSwitch ($sysctl_conf)"
  printf '%s\n' "# fabric-emu: room for Open vSwitch's userspace-datapath sockets (see scripts/setup.sh)" \
    "net.core.wmem_default = $want_wmem" "net.core.rmem_default = $want_rmem" > "$sysctl_conf"
fi
sysctl -q -p "$sysctl_conf"

# Open vSwitch's kernel datapath, where the kernel has the module (a lab VM, most Linux boxes;
# not our CI kernel): load it and create the datapath before ovs-vswitchd starts. Started the
# other way round, its first bridge came up with no handler threads and lost every upcall
# (`ovs-dpctl show`: lost; 3 of 3 boots of a Debian 12 VM). tun: the userspace datapath's.
if modprobe openvswitch 2>/dev/null; then
  ovs-dpctl show system@ovs-system >/dev/null 2>&1 || ovs-dpctl add-dp system@ovs-system
fi
modprobe tun 2>/dev/null || true
# Open vSwitch: the kernel module may be missing (it is on our CI kernel), so start the
# daemons with ovs-ctl, which skips the module load when asked to.
if ! ovs-vsctl --timeout=2 show >/dev/null 2>&1 || ! ovs-appctl --timeout=2 version >/dev/null 2>&1; then
  log "starting Open vSwitch daemons ($( [ -d /sys/module/openvswitch ] && echo "kernel and userspace datapaths" || echo "userspace datapath: this kernel has no openvswitch module"))"
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null 2>&1 || true
fi
# An ovs-vswitchd started before the settings above keeps its small shared send socket:
# restart it, unless a fabric-emu run is using it right now.
ovs_send_buf=$(ss -0 -a -m -n -p 2>/dev/null | awk '/"ovs-vswitchd"/ && /\[0\]:\*/ {match($0, /tb[0-9]+/); print substr($0, RSTART+2, RLENGTH-2); exit}')
if [ -n "$ovs_send_buf" ] && [ "$ovs_send_buf" -lt "$want_wmem" ]; then
  if flock -n /var/lib/fabric-emu/run.lock true 2>/dev/null || [ ! -e /var/lib/fabric-emu/run.lock ]; then
    log "restarting ovs-vswitchd so its send socket gets the larger buffer"
    /usr/share/openvswitch/scripts/ovs-ctl restart --system-id=random >/dev/null 2>&1 || true
  else
    log "warning: a fabric-emu run is active; not restarting ovs-vswitchd (send buffer $ovs_send_buf B)"
  fi
fi
if ! ovs-vsctl --timeout=5 show >/dev/null || ! ovs-appctl --timeout=5 version >/dev/null; then
  echo "error: Open vSwitch did not start; see /var/log/openvswitch/" >&2
  exit 1
fi

# Python: a venv on Debian's interpreter so Debian's mininet package is importable. We add
# only mininet's directory to the venv's path (not all of dist-packages), so every other
# dependency comes pinned from requirements.txt.
py=/usr/bin/python3
if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment $venv"
  "$py" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$venv/debian-mininet"
ln -sfn /usr/lib/python3/dist-packages/mininet "$venv/debian-mininet/mininet"
# The venv's real path: a checkout whose .venv links to another's must not point it here.
echo "$(cd "$venv" && pwd -P)/debian-mininet" > "$site/debian_mininet.pth"

# What the venv is made of: the pins and pyproject's [project] table (its dependencies and
# entry points), not the test and lint settings beside them.
req_hash=$( { cat "$here/requirements.txt"; sed -n '/^\[project/,/^\[tool/p' "$here/pyproject.toml"; } \
           | sha256sum | cut -c1-16)
if [ ! -f "$venv/.req-$req_hash" ]; then
  log "installing Python dependencies"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$here"
  rm -f "$venv"/.req-* && touch "$venv/.req-$req_hash"
fi
# The switch ports' tc-BPF programs (fabric_emu/ports/bpf/port.c) and the PFC responder
# (fabric_emu/ports/responder.c): compile them now, so a broken tool chain shows here and not in
# the middle of a run; cached per source version.
"$venv/bin/python" -c "from fabric_emu.ports import datapath, responder; datapath.build_object(); responder.build()"
log "ready: $venv/bin/fabric-emu"
