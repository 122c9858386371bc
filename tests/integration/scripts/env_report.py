"""Reports, per rank, the variables a test passed with `labctl run -e/--env-file`, and fails (exit 3)
when one is missing: every rank must see them. Needs no torch, so it starts in a blink."""

import os
import sys

WANTED = [name for name in os.environ.get("EXPECT_VARS", "").split(",") if name]

missing = [name for name in WANTED + ["EXPECT_VARS"] if name not in os.environ]
rank = os.environ.get("RANK", "?")
if missing:
    print(f"ENV_REPORT rank={rank} missing={','.join(missing)}", flush=True)
    sys.exit(3)
values = " ".join(f"{name}={os.environ[name]!r}" for name in WANTED)
print(f"ENV_REPORT rank={rank} script={sys.argv[0]} {values}", flush=True)
