"""Human units, parsed once into typed values with range checks (tcconfig's lesson).

Rates are tc's bit units: `kbit`, `mbit`, `gbit` (SI, 1000-based). tc reads `kbps`, `mbps`,
`gbps` as BYTES per second, so `100mbps` is 800 Mbit/s, the classic 8x surprise: those are
refused with the bit value the user probably meant, never applied. Message sizes follow
nccl-tests: `K`, `M`, `G` are 1024-based.
"""

from __future__ import annotations

import math
import re

from labctl.errors import ConfigError

MIN_RATE_BPS = 8_000  # 8kbit: below this tc's rate tables lose meaning
MAX_RATE_BPS = 100_000_000_000  # 100gbit: far beyond what tc shapes reliably (about 1gbit, per Mininet)
MAX_TIME_US = 10_000_000  # 10 s of added delay is already absurd for a training link

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)(bit|bps)$", re.IGNORECASE)
_TIME_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.IGNORECASE)
_SIZE_RE = re.compile(r"^(\d+)([kmg]?)(i?b)?$", re.IGNORECASE)
_SI = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
_BINARY = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_TIME_US = {"us": 1, "ms": 1_000, "s": 1_000_000}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$", re.IGNORECASE)
_DURATION_S = {"s": 1, "m": 60, "h": 3600}
MAX_DURATION_S = 24 * 3600


def parse_rate(text: str, key: str = "--bw") -> int:
    """'100mbit' -> 100_000_000 bits per second."""
    raw = str(text).strip()
    match = _RATE_RE.match(raw)
    if not match:
        hint = "add a unit: 100mbit, 1gbit" if re.fullmatch(r"\d+(\.\d+)?", raw) else None
        raise ConfigError(key, text, "must be a rate such as 100mbit or 1gbit (units bit, kbit, mbit, gbit)", hint=hint)
    number, prefix, unit = float(match.group(1)), match.group(2).lower(), match.group(3).lower()
    if unit == "bps":
        name = {"": "", "k": "kilo", "m": "mega", "g": "giga"}[prefix]
        as_bits = format_rate(round(number * _SI[prefix] * 8)) if number else "0bit"
        raise ConfigError(key, text, f"tc reads {prefix}bps as {name}BYTES per second ({raw} = {as_bits})",
                          hint=f"write {match.group(1)}{prefix}bit for {match.group(1)} {name}bits per second, "
                               f"or {as_bits} if you meant {raw} of bytes")
    rate_bps = number * _SI[prefix]
    if not MIN_RATE_BPS <= rate_bps <= MAX_RATE_BPS:
        raise ConfigError(key, text, "must be from 8kbit to 100gbit")
    return round(rate_bps)


def format_rate(rate_bps: int) -> str:
    """tc's short form: the largest unit that divides the rate exactly."""
    for unit, factor in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if rate_bps % factor == 0:
            return f"{rate_bps // factor}{unit}"
    return f"{rate_bps}bit"


def _with_unit(text, key: str, pattern: re.Pattern[str], units: dict[str, float], allowed: str, examples: str) -> float:
    """A number and its unit (`pattern`'s two groups) scaled by `units`; a bare number is told to add one."""
    raw = str(text).strip()
    match = pattern.match(raw)
    if not match:
        hint = f"add a unit: {examples}" if re.fullmatch(r"\d+(\.\d+)?", raw) else None
        raise ConfigError(key, text, allowed, hint=hint)
    return float(match.group(1)) * units[match.group(2).lower()]


def parse_time_us(text: str, key: str) -> int:
    """'10ms' -> 10_000 microseconds."""
    time_us = _with_unit(text, key, _TIME_RE, _TIME_US, "must be a time such as 10ms, 500us or 1s", "10ms, 500us, 1s")
    if time_us > MAX_TIME_US:
        raise ConfigError(key, text, "must be from 0 to 10s")
    return round(time_us)


def parse_duration_s(text: str | int | float, key: str = "--duration") -> int:
    """'30s', '2m', '1h' -> whole seconds, from 1 s to 24 h; a number is taken as seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        seconds = _with_unit(text, key, _DURATION_RE, _DURATION_S, "must be a duration such as 30s, 2m or 1h",
                             "30s, 2m, 1h")
    if not (math.isfinite(seconds) and 1 <= round(seconds) <= MAX_DURATION_S):
        raise ConfigError(key, text, "must be from 1s to 24h")
    return round(seconds)


def parse_loss_pct(text: str, key: str = "--loss") -> float:
    raw = str(text).strip().removesuffix("%").strip()
    try:
        loss = float(raw)
    except ValueError:
        raise ConfigError(key, text, "must be a percentage such as 1 or 0.5%") from None
    if not math.isfinite(loss) or not 0 <= loss <= 100:
        raise ConfigError(key, text, "must be a percentage from 0 to 100")
    return loss


def format_bytes(size: int) -> str:
    """A size as docker shows images' (1000-based): '950.1 MB', '8.1 GB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def parse_size(text: str, key: str = "--sizes") -> int:
    """Message size: '16M' -> 16 MiB in bytes (1024-based, as nccl-tests)."""
    match = _SIZE_RE.match(str(text).strip())
    if not match:
        raise ConfigError(key, text, "sizes are bytes with an optional K, M or G (1024-based), e.g. 4K or 16M")
    size = int(match.group(1)) * _BINARY[match.group(2).lower()]
    if size < 4 or size % 4:
        raise ConfigError(key, text, "each size must be a multiple of 4 bytes (float32 elements), at least 4")
    return size


def parse_size_range(text: str, key: str = "--sizes") -> list[int]:
    """'1K:256M' -> 1K, 2K, 4K, ... 256M (doubling); also a single size or a comma list."""
    raw = str(text).strip()
    if ":" not in raw:
        sizes = [parse_size(part, key) for part in raw.split(",") if part.strip()]
        if not sizes:
            raise ConfigError(key, text, "must be a size range such as 1K:256M or sizes such as 4M,16M")
        return sizes
    lo_text, _, hi_text = raw.partition(":")
    lo, hi = parse_size(lo_text, key), parse_size(hi_text, key)
    if lo > hi:
        raise ConfigError(key, text, "the range must go from the smaller size to the larger, e.g. 1K:256M")
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size *= 2
    if len(sizes) > 40:
        raise ConfigError(key, text, "spans more than 40 doublings")
    return sizes

