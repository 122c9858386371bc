"""What `labctl doctor` reads of a node or host: `python -c TEXT` (labctl.diagnose.doctor).

Prints one line of JSON: hostname, Python, torch, CUDA and NCCL versions (null where absent),
whether rsync is installed (`labctl hosts sync` needs it at both ends), and each interface's IPv4
addresses as ADDRESS/PREFIX, from `ip -j -4 addr` (an empty map without iproute2). Fast: it reads
torch's version file instead of importing torch, which costs seconds.
"""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys


def torch_versions():
    """torch's version.py, read without importing torch: {"__version__": ..., "cuda": ...}, or {}."""
    spec = importlib.util.find_spec("torch")
    version = {}
    if spec and spec.origin:
        try:
            exec(open(os.path.join(os.path.dirname(spec.origin), "version.py")).read(), version)
        except OSError:
            pass
    return version


def nccl_version():
    """NCCL ships as a pip package (nvidia-nccl-cu12, -cu13) beside CUDA builds of torch: its
    metadata's version, or None."""
    import importlib.metadata

    found = None
    for dist in importlib.metadata.distributions():
        if (dist.metadata["Name"] or "").lower().startswith("nvidia-nccl"):
            found = dist.version
    return found


def interfaces():
    """{ifname: ["ADDRESS/PREFIX", ...]} for the IPv4 addresses `ip` reports."""
    try:
        addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]")
    except OSError:
        addrs = []
    return {a["ifname"]: ["%s/%s" % (i["local"], i["prefixlen"]) for i in a.get("addr_info", [])] for a in addrs}


def info():
    out = {"hostname": socket.gethostname(), "python": sys.version.split()[0]}
    version = torch_versions()
    out["torch"], out["cuda"] = version.get("__version__"), version.get("cuda")
    out["nccl"] = nccl_version() if out["cuda"] else None
    out["rsync"] = shutil.which("rsync") is not None
    out["ifaces"] = interfaces()
    return out


if __name__ == "__main__":
    print(json.dumps(info()))
