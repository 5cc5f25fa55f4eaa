#!/bin/bash
# PID 1 of the lab VM, from the shared repository: the image's /sbin/fabric-emu-vm-init
# (scripts/vm/build-image.sh) has mounted /proc and the repository, at the path it has on the
# host (so its .venv works unchanged), and execs this. Mount what Mininet, Open vSwitch and the
# port programs need and the run's io folder, run the set-up and then io/cmd.sh from the
# repository's root, write the exit code to io/rc, and power off. No systemd: a boot under software
# emulation takes seconds this way; the set-up script starts Open vSwitch itself.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mountpoint -q /sys || mount -t sysfs sysfs /sys  # the initrd has mounted these two
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^fe\.$1=//p"; }
repo=$(arg repo)
# Fresh /run and /tmp, except where the repository is mounted (a clone under /tmp, say).
for d in /run /tmp; do
  case "$repo/" in "$d"/*) ;; *) mount -t tmpfs tmpfs "$d" ;; esac
done
mkdir -p /run/lock /run/openvswitch
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
hostname fabric-emu-vm
ip link set lo up
echo "fabric-emu-vm: init on $(uname -r), $(nproc) CPUs" > /dev/console

mkdir -p /mnt/io
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 io /mnt/io
cd "$repo"
start=$(date +%s)
# The project's own set-up first, as a Vagrant box is provisioned (it finds the packages in
# the image and the venv shared in, loads openvswitch.ko and starts Open vSwitch), then the command.
{ bash scripts/setup.sh && bash /mnt/io/cmd.sh; } > >(tee /mnt/io/output.log > /dev/console) 2>&1
rc=$?
sleep 0.5  # tee's last lines
echo "fabric-emu-vm: command exited $rc after $(( $(date +%s) - start )) s" > /dev/console
echo "$rc" > /mnt/io/rc
sync
echo o > /proc/sysrq-trigger
sleep 10
