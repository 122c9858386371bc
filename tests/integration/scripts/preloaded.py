"""Say whether the module named by argv[1] was imported before this script's first line: the fork
server's --preload imports it once, and a worker forked from it finds it in sys.modules."""

import sys

name = sys.argv[1]
print(f"{name} preloaded: {name in sys.modules}", flush=True)
