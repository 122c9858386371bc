"""Which version of a package every rank of a job imports: the package-drift scenario's job
(labctl/diagnose/traps.py), run as `python -c TEXT PACKAGE` with a static launch's environment.

Every rank joins a gloo group, reads PACKAGE's version from the metadata its own node's Python
finds, and gathers the others'. Rank 0 prints one line per rank, then either `package drift:` and
who has what, or that every rank has the same version. Nothing in torch compares them: the job
itself succeeds either way, which is the trap.
"""

import json
import socket
import sys
from importlib.metadata import PackageNotFoundError, version

import torch.distributed as dist


def main(package):
    dist.init_process_group("gloo")
    try:
        mine = version(package)
    except PackageNotFoundError:
        mine = None
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, [socket.gethostname(), mine])
    if dist.get_rank() == 0:
        for rank, (host, found) in enumerate(seen):
            print("rank %d on %s: %s %s" % (rank, host, package, found or "missing"), flush=True)
        versions = sorted({str(found) for _, found in seen})
        if len(versions) > 1:
            who = ", ".join("%s on %s" % (found or "missing", host) for host, found in seen)
            print("package drift: %s %s (one job, %d versions)" % (package, who, len(versions)), flush=True)
        else:
            print("every rank imports %s %s" % (package, versions[0]), flush=True)
        print("SUMMARY " + json.dumps({"package": package, "versions": [found for _, found in seen]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
