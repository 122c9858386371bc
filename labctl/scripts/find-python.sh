#!/usr/bin/env bash
# Print the path of the Python interpreter named by $1 (default python3), for `make PYTHON=...`.
#
# `make demo PYTHON=python3.12` should mean that interpreter wherever it is installed. Under
# pyenv, a version that is installed but not selected has a shim that answers "command not
# found"; `pyenv whence` names the versions that have the command, and the newest one is used.
# labctl needs Python 3.10 or newer (pyproject.toml); an older or missing one is refused here,
# before a virtual environment is made with it.
set -euo pipefail

name=${1:-python3}
die() { printf 'error: %s\n' "$*" >&2; exit 2; }

works() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }

path=""
if command -v "$name" >/dev/null 2>&1 && "$name" -c 'import sys' >/dev/null 2>&1; then
  path=$(command -v "$name")
elif command -v pyenv >/dev/null 2>&1; then
  version=$(pyenv whence "$name" 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$version" ] && path="$(pyenv prefix "$version")/bin/$name"
fi
[ -n "$path" ] || die "PYTHON=$name: no such interpreter on PATH (nor in pyenv). Install it, or pass PYTHON=/path/to/python3"
works "$path" || die "PYTHON=$name ($path) is $("$path" -V 2>&1); labctl needs Python 3.10 or newer"
printf '%s\n' "$path"
