#!/usr/bin/env bash
# Make sure the tools a part of the project needs are here. Idempotent; as root on Debian it
# installs what is missing, elsewhere it says what to install.
#
#   ensure-tools.sh [TAG COMMAND:PACKAGE ...]
#
# Without arguments: what `labctl hosts` drives machines with, the OpenSSH client (ssh,
# ssh-keygen, ssh-keyscan) and rsync. A pair with an empty COMMAND (":PACKAGE") is installed
# unconditionally: the caller has decided it is missing (tests/netem/ensure-vm-tools.sh does).
set -euo pipefail

tag=tools
pairs=(ssh:openssh-client ssh-keygen:openssh-client ssh-keyscan:openssh-client rsync:rsync)
if [ $# -gt 0 ]; then
  tag=$1
  shift
  pairs=("$@")
fi

missing=()
for pair in "${pairs[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  printf '[%s] error: missing %s; install them (e.g. sudo apt-get install %s)\n' "$tag" "$packages" "$packages" >&2
  exit 1
fi
printf '[%s] installing %s\n' "$tag" "$packages" >&2
# Another apt-get holding dpkg's lock (a second make, the machine's own updates) is waited for, not failed on.
wait_lock=(-o DPkg::Lock::Timeout=600)
# shellcheck disable=SC2086 # one word per package
apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends $packages >/dev/null 2>&1 \
  || { apt-get "${wait_lock[@]}" update -qq >/dev/null \
       && apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends $packages >/dev/null; }
