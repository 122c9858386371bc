#!/bin/sh
# /init of the netem VM: a minimal userland (busybox; dash is sh), the kernel modules a lab's host has
# (veth, ifb, tbf, ingress, u32, mirred), then /guest/run.sh, then power off. Everything it prints
# goes to the serial console, which netem_vm.py reads on the host.
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
# iproute2's ip and tc, as in a lab's node, never busybox's applets of the same names.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
# No module autoloading: with it, the first tc that names netem would load sch_netem by itself and
# the VM could never be a kernel without netem. sch_netem is loaded by run.sh, by hand.
echo /sbin/no-modprobe > /proc/sys/kernel/modprobe
read -r order < /modules/order
for name in $order; do
  insmod "/modules/$name.ko" || echo "@@netem-error insmod $name failed"
done
ip link set lo up
sh /guest/run.sh
echo "@@netem-done rc=$? uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
