#!/bin/sh
# Run by labctl (labctl/engine.py) in a short container started as a node would be: the workspace
# bind-mounted at its own path, as the nodes' user. $1 is a file labctl just wrote in the
# workspace: printing its token proves the engine mounts this very folder (a remote engine
# mounts an empty or another one). $2 is a file to create beside it: labctl then checks that it
# appeared on its side and belongs to the caller (rootless Docker and userns-remap map users).
set -u
cat "$1" || exit 3
echo ok > "$2" || exit 4
