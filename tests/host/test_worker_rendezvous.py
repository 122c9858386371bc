"""A cold agent (`python -c worker.py -m torch.distributed.run ...` with nothing imported) gets the
rendezvous' fast_method_name when torchrun imports the module, and the script sees torch's module
otherwise as it is."""

from __future__ import annotations

import subprocess
import sys

from labctl import remote
from labctl.remote import worker

WORKER = remote.load("worker.py")
CHECK = (f"import sys; assert {worker.RENDEZVOUS!r} not in sys.modules; import {worker.RENDEZVOUS} as r; "
         "print(r.get_method_name.__name__, r.DynamicRendezvousHandler.__name__)")


def test_a_cold_worker_gives_the_rendezvous_the_fast_name_once_it_is_imported():
    done = subprocess.run([sys.executable, "-c", WORKER, "-c", CHECK], capture_output=True, text=True, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout) == (0, "fast_method_name DynamicRendezvousHandler\n"), done.stderr
