#!/bin/sh
# The first step on each host before `labctl hosts sync` (labctl/hosts/actions.py), run as
#   sh -c TEXT sh WORKSPACE STATE NAME   with the host's env file on stdin.
# The workspace must be labctl's: absent, empty, or marked by an earlier sync, never a folder of the
# user's that rsync --delete would empty (then it prints DDPLAB_NOT_OURS and exits 3). It marks the
# workspace, and writes stdin to WORKSPACE/STATE/NAME whole or not at all (a temporary file, renamed).
set -e
marker=.ddplab-workspace  # = labctl.hosts.ssh.MARKER
ws=$1; state=$2; name=$3
if [ -d "$ws" ] && [ -n "$(ls -A "$ws")" ] && [ ! -e "$ws/$marker" ]; then
  echo "DDPLAB_NOT_OURS"; exit 3
fi
mkdir -p "$ws/$state"
touch "$ws/$marker"
cat > "$ws/$state/$name.tmp"
mv "$ws/$state/$name.tmp" "$ws/$state/$name"
