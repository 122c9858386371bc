"""Which interpreter and platform the node image installs wheels for.

labctl runs this with the base image's own `python3 -c` (labctl/image/image.py): the host that runs
labctl may have any Python on any OS, so only the image can say what its Python is. It prints one
line of JSON; it must run on any Python 3 the base image may have, so it uses nothing newer.
"""

import json
import platform
import sys

libc, libc_version = platform.libc_ver()
print(json.dumps({
    "implementation": sys.implementation.name,
    "python": "%d.%d" % sys.version_info[:2],
    "libc": libc,
    "glibc": libc_version,
    "machine": platform.machine(),
}))
