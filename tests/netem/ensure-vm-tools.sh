#!/usr/bin/env bash
# Make sure the tools the netem VM test (tests/integration/test_netem_kernel.py) needs are here:
# QEMU (qemu-system-x86_64), cpio, a static busybox for the guest, and iperf3 (copied into the
# guest with its libraries). Idempotent; as root on Debian it installs what is missing, elsewhere
# it says what to install. The kernel itself is fetched by tests/netem/build-vm.sh.
set -euo pipefail

missing=()
for pair in qemu-system-x86_64:qemu-system-x86 cpio:cpio busybox:busybox-static iperf3:iperf3 \
            apt-get:apt dpkg-deb:dpkg tc:iproute2 ip:iproute2; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# A dynamically linked busybox (Debian's `busybox` package) would need its libc in the guest too.
if command -v busybox >/dev/null 2>&1 && ldd "$(command -v busybox)" >/dev/null 2>&1; then
  missing+=(busybox-static)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  printf '[netem-vm] error: missing %s; install them (e.g. sudo apt-get install %s)\n' "$packages" "$packages" >&2
  exit 1
fi
printf '[netem-vm] installing %s\n' "$packages" >&2
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq --no-install-recommends $packages >/dev/null 2>&1 \
  || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $packages >/dev/null; }
