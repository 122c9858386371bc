#!/bin/sh
# Entry point of every lab node (copied into the image): report what this node runs, then
# become the idle host process given as the command. `labctl up` waits for the READY line.
#
# It checks that the node's Python finds torch and reads its version, which takes milliseconds.
# A full `import torch` costs about 2 CPU-seconds and is the same on every node of one image, so
# the image build does that once (see the Dockerfile) instead of every node at every start.
python - <<'PY' || exit 1
import importlib.metadata, importlib.util, platform, sys
if importlib.util.find_spec("torch") is None:
    sys.exit("DDPLAB_NOT_READY: this node's Python cannot find torch")
print(f"DDPLAB_READY torch={importlib.metadata.version('torch')} python={platform.python_version()}", flush=True)
PY
exec "$@"
