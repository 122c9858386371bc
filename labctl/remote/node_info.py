"""What `labctl doctor` reads of a node or host: `python -c TEXT` (labctl.diagnose.doctor).

Prints one line of JSON: hostname, Python, torch, CUDA and NCCL versions (null where absent), every
distribution the node's Python sees (name and version: doctor compares them with the lab's lock),
whether rsync is installed (`labctl hosts sync` needs it at both ends), each interface's IPv4
addresses as ADDRESS/PREFIX, from `ip -j -4 addr` (an empty map without iproute2), the NVIDIA
driver's version and the GPUs this node's processes can use (see gpus()), and the C++ compiler and
Python headers torch.compile needs (see compiler()). Fast: it reads torch's
version file instead of importing torch, which costs seconds, and asks nvidia-smi, not CUDA.
"""

import glob
import importlib.util
import json
import os
import re
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


def distributions():
    """{name: version} of every distribution this Python sees, names normalised as PEP 503 does; where
    two folders on sys.path hold one name, the first, as `import` finds it. Read from the metadata
    folders' names (NAME-VERSION.dist-info, as PEP 427 and 627 write them; NAME-VERSION[-pyX.Y].egg-info):
    importlib.metadata parses every METADATA file, about 90 ms for a node's forty."""
    found = {}
    for folder in sys.path:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            stem, _, kind = entry.rpartition(".")
            if kind not in ("dist-info", "egg-info"):
                continue
            name, _, version = stem.partition("-")
            name = re.sub(r"[-_.]+", "-", name).lower()
            if name not in found:
                found[name] = version.split("-")[0] or pkg_info_version(os.path.join(folder or ".", entry))
    return found


def pkg_info_version(path):
    """The Version: of a NAME.egg-info (a `pip install -e` of a setup.py project names no version)."""
    try:
        with open(os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path, errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("Version:")), "")
    except OSError:
        return ""


def nccl_version(packages):
    """NCCL ships as a pip package (nvidia-nccl-cu12, -cu13) beside CUDA builds of torch: its
    metadata's version, or None."""
    return next((version for name, version in sorted(packages.items()) if name.startswith("nvidia-nccl")), None)


def interfaces():
    """{ifname: ["ADDRESS/PREFIX", ...]} for the IPv4 addresses `ip` reports."""
    try:
        addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]")
    except OSError:
        addrs = []
    return {a["ifname"]: ["%s/%s" % (i["local"], i["prefixlen"]) for i in a.get("addr_info", [])] for a in addrs}


GPU_FIELDS = ("index", "name", "uuid", "driver_version")


def visible_filter(gpus, visible):
    """The GPUs of `gpus` that CUDA_VISIBLE_DEVICES=`visible` leaves (by index or UUID), in its order."""
    out = []
    for want in [v.strip() for v in visible.split(",") if v.strip()]:
        out += [g for g in gpus if want in (g.get("index"), g.get("uuid")) and g not in out]
    return out


def nvidia_smi():
    """[{index, name, uuid, driver_version}] of every GPU nvidia-smi lists, or None without a working nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    return [dict(zip(GPU_FIELDS, row)) for row in rows if len(row) == len(GPU_FIELDS)]


def gpus():
    """(the GPUs this node's processes can use, where that came from). nvidia-smi's list, narrowed by
    CUDA_VISIBLE_DEVICES as CUDA narrows it; without nvidia-smi, the ids CUDA_VISIBLE_DEVICES or
    NVIDIA_VISIBLE_DEVICES name ({"index": id} or {"uuid": "GPU-..."}), or the /dev/nvidiaN device
    files; [] where no GPU device is there at all (a CPU node, whatever its environment says:
    CUDA base images set NVIDIA_VISIBLE_DEVICES=all with no GPU attached)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = nvidia_smi()
    if listed is not None:
        return (listed if visible is None else visible_filter(listed, visible)), "nvidia-smi"
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    if not devices:
        return [], None
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is not None and value.strip().lower() not in ("all", "void", "none"):
            ids = [v.strip() for v in value.split(",") if v.strip()]
            return [{"uuid": i} if i.startswith(("GPU-", "MIG-")) else {"index": i} for i in ids], var
    return [{"index": d[len("/dev/nvidia"):]} for d in devices], "/dev/nvidia*"


def driver_version(found):
    """The NVIDIA driver's version: nvidia-smi's, else the kernel module's, else None."""
    for gpu in found:
        if gpu.get("driver_version"):
            return gpu["driver_version"]
    try:
        with open("/proc/driver/nvidia/version") as f:
            match = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\w.]*)", f.read())
        return match.group(1) if match else None
    except OSError:
        return None


def compiler():
    """What torch.compile's CPU backend (inductor) needs to build its kernels: the C++ compiler it
    will call ($CXX, else g++, as torch._inductor.config.cpp.cxx reads it), that compiler's
    version, and whether this Python's headers are there (Python.h)."""
    import sysconfig

    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    version = None
    if path:
        try:
            version = subprocess.run([path, "-dumpfullversion"], capture_output=True, text=True,
                                     timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            path = None
    include = sysconfig.get_paths().get("include") or ""
    return {"cxx": cxx, "path": path, "version": version,
            "python_h": os.path.exists(os.path.join(include, "Python.h"))}


def info():
    out = {"hostname": socket.gethostname(), "python": sys.version.split()[0]}
    version = torch_versions()
    out["torch"], out["cuda"] = version.get("__version__"), version.get("cuda")
    out["packages"] = distributions()
    out["nccl"] = nccl_version(out["packages"]) if out["cuda"] else None
    out["rsync"] = shutil.which("rsync") is not None
    out["ifaces"] = interfaces()
    out["gpus"], out["gpu_source"] = gpus()
    out["driver"] = driver_version(out["gpus"])
    out["compiler"] = compiler()
    return out


if __name__ == "__main__":
    # `python -c TEXT [FOLDER...]`: folders a job's PYTHONPATH puts first (a host's packages folder),
    # so the distributions are the ones the job will see
    sys.path[:0] = [os.path.abspath(folder) for folder in sys.argv[1:]]
    print(json.dumps(info()))
