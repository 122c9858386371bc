#!/usr/bin/env bash
# Make sure the tools the netem VM test (tests/integration/test_netem_kernel.py) needs are here:
# QEMU (qemu-system-x86_64), cpio, a static busybox for the guest, and iperf3 (copied into the
# guest with its libraries), through the project's own installer (labctl/scripts/ensure-tools.sh).
# The kernel itself is fetched by tests/netem/build-vm.sh.
set -euo pipefail

pairs=(qemu-system-x86_64:qemu-system-x86 cpio:cpio busybox:busybox-static iperf3:iperf3
       apt-get:apt dpkg-deb:dpkg tc:iproute2 ip:iproute2)
# A dynamically linked busybox (Debian's `busybox` package) would need its libc in the guest too.
if command -v busybox >/dev/null 2>&1 && ldd "$(command -v busybox)" >/dev/null 2>&1; then
  pairs+=(:busybox-static)
fi
exec bash "$(dirname "$0")/../../labctl/scripts/ensure-tools.sh" netem-vm "${pairs[@]}"
