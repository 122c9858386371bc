"""Prints `tick I of NODE` COUNT times, INTERVAL seconds apart (argv: COUNT INTERVAL), flushed: a run
whose logs grow while `labctl logs -f` watches. No torch: it runs under `--launcher static`."""

import os
import sys
import time

count, interval = int(sys.argv[1]), float(sys.argv[2])
for i in range(count):
    print(f"tick {i} of node{os.environ['NODE_RANK']}", flush=True)
    time.sleep(interval)
