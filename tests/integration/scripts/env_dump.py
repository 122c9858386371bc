"""Prints this process's whole environment as one JSON line (ENV_DUMP {...}), with what Python
itself says of how it was started: the same script under torchrun and on the warm path must see the
same world."""

import json
import os
import sys

line = "ENV_DUMP " + json.dumps({"env": dict(os.environ), "argv": sys.argv, "name": __name__, "file": __file__,
                                 "path0": sys.path[0], "cwd": os.getcwd()})
# One write of the whole line (under PIPE_BUF): ranks on one node share torchrun's stdout, and
# print() writes the text and its newline separately.
os.write(1, (line + "\n").encode())
