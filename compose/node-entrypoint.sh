#!/bin/sh
# Entry point of every lab node (copied into the image): report what this node runs, then
# become the idle host process given as the command. `labctl up` waits for the READY line.
#
# It checks that the node's Python finds the torch package and reads its version from
# torch/version.py, which takes milliseconds. A full `import torch` costs about 2 CPU-seconds and
# is the same on every node of one image, so the image build does that once (see the Dockerfile)
# instead of every node at every start: 16 nodes on 2 cores would otherwise wait about 16 s.
python - <<'PY' || exit 1
import importlib.util, platform, re, sys
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit("DDPLAB_NOT_READY: this node's Python cannot find torch")
with open(spec.submodule_search_locations[0] + "/version.py") as f:
    version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read()).group(1)
print(f"DDPLAB_READY torch={version} python={platform.python_version()}", flush=True)
PY
exec "$@"
