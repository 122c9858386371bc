"""labctl's command line: a thin layer over labctl.api and the domain packages.

Each module here holds one group of commands (lab, run, net, diagnose, hosts, bench); a command
parses its options, makes one call below, and hands the result to `render` (taken from `lazy`,
which imports a renderer, and rich, at its first use). Only this package exits the process
(app.LabGroup turns the project's errors into a message and an exit status).

`labctl` runs `app.main`, which imports a command's module only when that command runs, so
`labctl up` does not pay for the benches. `from labctl.cli import main` gives the same group with
every command loaded (for tests and tools that walk the command tree).
"""


def __getattr__(name: str):
    if name == "main":
        from labctl.cli.app import load_all_commands, main

        load_all_commands()
        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
