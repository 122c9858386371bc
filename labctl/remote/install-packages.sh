#!/bin/sh
# Install a lab's lock into a folder of its own on a real host (labctl/hosts/packages.py), run as
#   sh -c TEXT sh PYTHON TARGET WHEELS DIGEST   with the lock's requirements (pip's hash-checking
# form) on stdin. The wheels are in WHEELS already (rsync); nothing is asked of an index. TARGET is
# made whole or not at all, and marked with the lock's digest: a second call for the same lock
# finds it and prints DDPLAB_PACKAGES_PRESENT. The job finds TARGET first on PYTHONPATH (the host's
# env file), so the lock's versions win over whatever the host's Python has.
set -e
python=$1; target=$2; wheels=$3; digest=$4
mark=.ddplab-lock  # = labctl.hosts.packages.MARK
if [ "$(cat "$target/$mark" 2>/dev/null)" = "$digest" ]; then
  echo "DDPLAB_PACKAGES_PRESENT"; exit 0
fi
mkdir -p "$wheels"
cat > "$wheels/requirements.txt"
rm -rf "$target.tmp"
mkdir -p "$target.tmp"
if [ -s "$wheels/requirements.txt" ]; then
  "$python" -m pip install --quiet --no-index --no-deps --require-hashes --disable-pip-version-check \
    --no-cache-dir --target "$target.tmp" --find-links "$wheels" -r "$wheels/requirements.txt"
fi
echo "$digest" > "$target.tmp/$mark"
rm -rf "$target"
mv "$target.tmp" "$target"
echo "DDPLAB_PACKAGES_INSTALLED"
