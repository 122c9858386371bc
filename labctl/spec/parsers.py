"""The syntax of every setting: each parser takes the raw text (from a flag, `.env`, DDPLAB_* or a
keyword argument) and returns the typed value, or raises ValueError saying what is allowed.

Pure and at the bottom of labctl: labctl.spec.labspec builds its table of settings from these, and the
host inventory (labctl.hosts.inventory) checks its own fields with the same ones.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Callable

MAX_NODES = 64  # beyond this a laptop or a 2-core CI runner is the bottleneck, not the lab
MAX_GPUS = 64  # GPUs one machine hands a lab: a count or an index beyond this is a typo
AUTO = "auto"
MIN_MEMORY_BYTES = 256 * 1024**2  # torch alone needs this much to import and run a tiny model
GPUS_ALLOWED = ("must be all, a count N (the first N GPUs), or GPU indices, comma-separated, such as 0,2 "
                "(one GPU by index: 1,); none or empty for no GPUs")
CUDA_ALLOWED = ("must be auto (exactly the GPU nodes), all, a count N (the first N nodes), or node names, "
                "comma-separated, such as node0,node1")

_NODE_RE = re.compile(r"^node(0|[1-9]\d*)$")
_MEMORY_RE = re.compile(r"^(\d+)([bkmg]?)$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A parser of whole numbers from lo to hi."""
    def parse(raw: str) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"must be a whole number from {lo} to {hi}") from None
        if not lo <= value <= hi:
            raise ValueError(f"must be from {lo} to {hi}")
        return value

    return parse


def matching(pattern: re.Pattern[str], allowed: str) -> Callable[[str], str]:
    """A parser of text that `pattern` matches (surrounding blanks dropped); `allowed` says what does."""
    def parse(raw: str) -> str:
        value = str(raw).strip()
        if not pattern.match(value):
            raise ValueError(allowed)
        return value

    return parse


def choice(*allowed: str) -> Callable[[str], str]:
    """A parser of one of `allowed`, in any case."""
    def parse(raw: str) -> str:
        value = str(raw).strip().lower()
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value

    return parse


def parse_subnet(raw: str) -> str:
    value = str(raw).strip()
    if value.lower() == AUTO:
        return AUTO
    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError("must be an IPv4 network in CIDR form such as 172.28.0.0/24, or 'auto'") from None
    if net.version != 4:
        raise ValueError("must be an IPv4 network (the lab network is IPv4 only)")
    if str(net) != value:
        raise ValueError(f"has host bits set; did you mean {net}?")
    if net.prefixlen > 28:
        raise ValueError("must be a /28 or larger (prefix length at most 28)")
    if net.is_loopback or net.is_multicast or net.is_link_local:
        raise ValueError("must be an ordinary private range, not loopback, multicast or link-local")
    return value


def parse_cpus(raw: str) -> float | None:
    value = str(raw).strip()
    if value in ("", "0", "none"):
        return None
    try:
        cpus = float(value)
    except ValueError:
        raise ValueError("must be a number of CPUs such as 0.5 or 2 (empty for no limit)") from None
    if not 0.01 <= cpus <= 1024:
        raise ValueError("must be from 0.01 to the host's CPU count (empty for no limit)")
    return cpus


def parse_memory(raw: str) -> int:
    match = _MEMORY_RE.match(str(raw).strip())
    if not match:
        raise ValueError("must be a size such as 512m or 4g (units b, k, m, g)")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]


def parse_memory_limit(raw: str) -> str | None:
    """A node's memory limit as Docker takes it ('4g'); None for no limit."""
    value = str(raw).strip().lower()
    if value in ("", "none", "0"):
        return None
    if parse_memory(value) < MIN_MEMORY_BYTES:
        raise ValueError("must be at least 256m: a node needs that much to run torch")
    return value


def parse_flag(raw: str) -> bool:
    """A yes/no setting: 1/true/yes/on or 0/false/no/off."""
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false (1/0, yes/no, on/off)")


def _count(raw: str, hi: int) -> int:
    value = int(raw)
    if not 1 <= value <= hi:
        raise ValueError(f"a count must be from 1 to {hi}")
    return value


def parse_gpus(raw: str) -> str | None:
    """'all', a count ('2') or indices ('0,2'; '1,' is GPU 1 alone), normalised; None for no GPUs."""
    value = str(raw).strip().lower().replace(" ", "")
    if value in ("", "none", "0"):
        return None
    if value == "all":
        return value
    if "," not in value:
        if not value.lstrip("-").isdigit():
            raise ValueError(GPUS_ALLOWED)
        return str(_count(value, MAX_GPUS))
    parts = value[:-1].split(",") if value.endswith(",") else value.split(",")
    if not all(p.isdigit() for p in parts):
        raise ValueError(GPUS_ALLOWED)
    indices = [int(p) for p in parts]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ValueError(f"names GPU {', '.join(map(str, twice))} more than once: a GPU goes to one node")
    if max(indices) >= MAX_GPUS:
        raise ValueError(f"GPU indices go from 0 to {MAX_GPUS - 1}")
    return ",".join(map(str, indices)) + ("," if len(indices) == 1 else "")


def parse_cuda(raw: str) -> str:
    """'auto', 'all', a count of nodes ('2') or node names ('node0,node2'), normalised."""
    value = str(raw).strip().lower().replace(" ", "")
    if value in ("", AUTO, "all"):
        return value or AUTO
    if value.lstrip("-").isdigit():
        return str(_count(value, MAX_NODES))
    names = [p for p in value.split(",") if p]
    if not names or not all(_NODE_RE.match(n) for n in names):
        raise ValueError(CUDA_ALLOWED)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"names {', '.join(twice)} more than once")
    return ",".join(names)


def parse_node_cpus(raw: str) -> tuple[tuple[str, float], ...]:
    """'node2=0.25,node0=1' -> (('node0', 1.0), ('node2', 0.25)): per-node CPU limits (stragglers),
    sorted by node; whether the nodes exist is the lab's to say (labctl.spec.labspec.check_node_cpus)."""
    limits: dict[str, float] = {}
    for part in (p.strip() for p in str(raw).split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not _NODE_RE.match(name):
            raise ValueError("must be NODE=CPUS pairs, comma-separated, e.g. node2=0.25")
        try:
            cpus = parse_cpus(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        if cpus is None:
            raise ValueError(f"{name}: give a CPU count such as 0.25")
        if name in limits:
            raise ValueError(f"names {name} twice")
        limits[name] = cpus
    if not limits:
        raise ValueError("must name at least one node, e.g. node2=0.25")
    return tuple(sorted(limits.items(), key=lambda item: int(item[0][4:])))


NONE_WORDS = ("", "none")
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_requirements_file(raw: str) -> str:
    """A requirements file, a pyproject.toml (`pyproject.toml:GROUP` for one dependency group, as
    pip's --group spells it) or a pylock.toml, as given; '' for none ('none' says so outright, to
    take a running lab's packages away). Whether the file exists is checked where it is read."""
    value = str(raw).strip()
    if value.lower() in NONE_WORDS:
        return ""
    if "\x00" in value or "\n" in value:
        raise ValueError("must be a file path")
    return value


def parse_requirement_list(raw: str) -> tuple[str, ...]:
    """'tqdm einops==0.8.1' -> ('tqdm', 'einops==0.8.1'): requirements as pip takes them, one per
    line or separated by blanks (then without blanks inside one), each checked by `packaging`. A
    direct URL or a path is refused: the nodes get released wheels from the package index."""
    from packaging.requirements import InvalidRequirement, Requirement

    text = str(raw)
    parts = [p.strip() for p in (text.splitlines() if "\n" in text else text.split())]
    out = []
    for part in (p for p in parts if p):
        try:
            requirement = Requirement(part)
        except InvalidRequirement as exc:
            why = " ".join(str(exc).split())
            raise ValueError(f"{part!r} is not a requirement ({why}); give NAME[==VERSION], e.g. tqdm==4.67.1") from None
        if requirement.url:
            raise ValueError(f"{part!r} names a URL: the nodes install released wheels from the package index "
                             "(your own code is in the workspace, which every node mounts)")
        out.append(str(requirement))
    return tuple(dict.fromkeys(out))


def parse_modules(raw: str) -> tuple[str, ...]:
    """'lightning,transformers' -> ('lightning', 'transformers'): module names, comma- or
    blank-separated, as `import` takes them."""
    names = [p for p in re.split(r"[,\s]+", str(raw).strip()) if p]
    bad = [n for n in names if not _MODULE_RE.match(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a module name; give names as `import` takes them, e.g. lightning,yaml")
    return tuple(dict.fromkeys(names))
