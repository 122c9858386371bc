"""The environment a user adds to every process of a run: `-e KEY=VALUE` and `--env-file FILE`, as
`docker run` takes them. Files are read in order, then each -e; a later value wins.

`-e KEY` (and a line `KEY` in a file) takes KEY's value from labctl's own environment, as docker
does; where docker then leaves an unset KEY out without a word, labctl says so (exit 2).
Files are read with python-dotenv's syntax (comments, quotes, `export KEY=...`) but, as docker
reads them, with no ${VAR} expansion: a value is what the file says.

Keys that labctl or torchrun set for the run (the rank, the world, the rendezvous, labctl's own
bookkeeping) are refused: a user's value would break the run or be silently overridden.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Iterable, Mapping

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from labctl.errors import ConfigError, LabError

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME_RULE = "a name is letters, digits and _, not starting with a digit"

# Set for every process by the launcher (static) or torchrun's agent, from the lab's env files.
RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "NNODES",
             "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT")
# labctl's own: `stop` finds a run's processes by DDPLAB_RUN_ID, per-rank metrics go to DDPLAB_RUN_DIR,
# the link's probes of each state of the lab's links to DDPLAB_LINKS_DIR (trainer/linkstate.py).
LABCTL_KEYS = ("DDPLAB_RUN_ID", "DDPLAB_RUN_DIR", "DDPLAB_LINKS_DIR", "DDPLAB_PG_TIMEOUT_S")
TORCHRUN_PREFIX = "PET_"  # torchrun reads its options from PET_<OPTION>; labctl sets them per run
# Where a refused key has a labctl option that does what the user meant.
OPTION_FOR = {
    "NPROC_PER_NODE": "--nproc_per_node", "PET_NPROC_PER_NODE": "--nproc_per_node",
    "PET_MAX_RESTARTS": "--max_restarts", "PET_NNODES": "--nnodes", "DDPLAB_PG_TIMEOUT_S": "--pg-timeout-s",
    "MASTER_PORT": "`labctl up --master_port`", "NNODES": "`labctl up --nodes`",
}


def is_reserved(key: str) -> bool:
    return key in RANK_KEYS or key in LABCTL_KEYS or key.startswith(TORCHRUN_PREFIX)


def check_user_env(env: Mapping[str, str], source: str = "-e/--env-file") -> dict[str, str]:
    """`env` as a plain dict, once every key is a valid name that labctl lets a user set."""
    bad = [key for key in env if not _NAME_RE.fullmatch(str(key))]
    if bad:
        raise ConfigError(source, bad[0], f"is not an environment variable name: {NAME_RULE}")
    nul = [key for key, value in env.items() if "\x00" in str(value)]
    if nul:
        raise ConfigError(source, nul[0], "has a NUL byte in its value, which no environment can hold")
    reserved = [key for key in env if is_reserved(key)]
    if reserved:
        options = [f"{OPTION_FOR[key]} for {key}" for key in reserved if key in OPTION_FOR]
        raise LabError(f"{source} cannot set {', '.join(reserved)}: labctl and torchrun set "
                       f"{'it' if len(reserved) == 1 else 'these'} for every process of the run (rank, world size, "
                       "rendezvous, and labctl's own record of the run), so a value of yours would break the run or "
                       "be overridden", hint="; ".join(options) or "drop it: each process's rank, world and "
                       "rendezvous come from the lab's env files (`labctl up` writes them) and labctl's options")
    return {str(key): str(value) for key, value in env.items()}


def parse_env_pair(text: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """-e 'KEY=VALUE' -> (KEY, VALUE); -e 'KEY' -> (KEY, KEY's value in `environ`)."""
    key, sep, value = text.partition("=")
    if not _NAME_RE.fullmatch(key):
        raise ConfigError("-e", text, f"must be KEY=VALUE or KEY, and {key!r} is not an environment variable "
                          f"name: {NAME_RULE}", hint="-e NCCL_DEBUG=INFO")
    if sep:
        return key, value
    if key not in environ:
        raise ConfigError("-e", text, f"takes {key}'s value from labctl's environment, where {key} is not set",
                          hint=f"give the value: -e {key}=VALUE, or export {key} first")
    return key, environ[key]


def parse_env_text(text: str, environ: Mapping[str, str], name: str) -> dict[str, str]:
    """The KEY=VALUE lines of an env file's `text` (`name` says which file, in errors)."""
    lines = {}
    for binding in parse_stream(io.StringIO(text)):
        where = f"{name}, line {binding.original.line}"
        if binding.error:
            raise LabError(f"--env-file {where}: not a KEY=VALUE line: {binding.original.string.strip()!r}",
                           hint="one KEY=VALUE per line; # starts a comment; quote a value with spaces")
        if binding.key is not None and not _NAME_RE.fullmatch(binding.key):
            raise ConfigError(f"--env-file {where}", binding.key, f"is not an environment variable name: {NAME_RULE}")
        lines[binding.key] = where
    env = {}
    for key, value in dotenv_values(stream=io.StringIO(text), interpolate=False).items():
        if value is None and key not in environ:
            raise LabError(f"--env-file {lines[key]}: {key} alone takes its value from labctl's environment, where "
                           f"{key} is not set", hint=f"write {key}=VALUE there, or export {key} first")
        env[key] = value if value is not None else environ[key]
    return env


def read_env_file(path: Path | str, environ: Mapping[str, str]) -> dict[str, str]:
    """`--env-file PATH` (relative to where labctl runs)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (FileNotFoundError, IsADirectoryError) as exc:
        what = ("is a folder, not a file" if isinstance(exc, IsADirectoryError)
                else f"no such file (looked in {path.absolute().parent})")
        raise ConfigError("--env-file", str(path), what,
                          hint="give the path of a file of KEY=VALUE lines, relative to where you run labctl") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--env-file", str(path), f"could not be read: {exc}") from None
    return parse_env_text(text, environ, str(path))


# `--nccl-debug`: NCCL logs its set-up (which transport, which interface, which GPU) at INIT and NET.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def build_user_env(pairs: Iterable[str], files: Iterable[Path | str], environ: Mapping[str, str],
                   nccl_debug: bool = False) -> dict[str, str]:
    """What `-e` and `--env-file` add to every process of a run: NCCL_DEBUG_ENV with `nccl_debug`,
    then the files in order, then each -e (so -e NCCL_DEBUG=TRACE still wins over --nccl-debug)."""
    env: dict[str, str] = dict(NCCL_DEBUG_ENV) if nccl_debug else {}
    for path in files:
        env.update(read_env_file(path, environ))
    for pair in pairs:
        key, value = parse_env_pair(pair, environ)
        env[key] = value
    return check_user_env(env)
