#!/usr/bin/env bash
# Make sure the tools `labctl hosts` drives machines with are here: the OpenSSH client (ssh,
# ssh-keygen, ssh-keyscan) and rsync. Idempotent; as root on Debian it installs what is missing,
# elsewhere it says what to install.
set -euo pipefail

missing=()
for pair in ssh:openssh-client ssh-keygen:openssh-client ssh-keyscan:openssh-client rsync:rsync; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  printf '[tools] error: missing %s; install them (e.g. sudo apt-get install %s)\n' "$packages" "$packages" >&2
  exit 1
fi
printf '[tools] installing %s\n' "$packages" >&2
apt-get install -y -qq --no-install-recommends $packages >/dev/null 2>&1 \
  || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $packages >/dev/null; }
