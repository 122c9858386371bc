"""labctl's command line: a thin layer over labctl.api and the domain packages.

Each module here holds one group of commands (lab, run, net, diagnose, hosts, bench); a command
parses its options, makes one call below, and hands the result to `render`. Only this package
exits the process (app.LabGroup turns the project's errors into a message and an exit status).
"""

from labctl.cli import bench, diagnose, hosts, lab, net, run  # noqa: F401 (each registers its commands)
from labctl.cli.app import main

__all__ = ["main"]
