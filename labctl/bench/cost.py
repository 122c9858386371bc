"""The communication cost model from first principles, the one people compute by hand.

A ring allreduce moves 2(n-1)/n x S bytes through each rank's NIC (S = gradient bytes);
reduce-scatter and all-gather move (n-1)/n x S each. Time on a link = those bytes / (rate x
efficiency) + a latency term: 2(n-1) hops x alpha for allreduce, (n-1) x alpha for the others.
These are also nccl-tests' busbw factors: busbw = algbw x 2(n-1)/n for allreduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from labctl.errors import ConfigError
from labctl.units import parse_rate

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
DEFAULT_EFFICIENCY = 0.85  # what a tuned TCP collective stack typically reaches on Ethernet
DEFAULT_ALPHA_S = 50e-6


@dataclass(frozen=True)
class Link:
    name: str
    rate_bps: float
    alpha_s: float  # per-hop latency: typical orders of magnitude, not measurements


# One direction's rate. NVLink 4 (H100): 900 GB/s in total, 450 GB/s each way = 3.6 Tbit/s.
PRESETS = {
    "1gbe": Link("1GbE", 1e9, 50e-6),
    "2.5gbe": Link("2.5GbE", 2.5e9, 50e-6),
    "10gbe": Link("10GbE", 10e9, 20e-6),
    "100g-roce": Link("100G-RoCE", 100e9, 5e-6),
    "400g-roce": Link("400G-RoCE", 400e9, 5e-6),
    "nvlink": Link("NVLink", 3.6e12, 2e-6),
}


def resolve_link(text: str, key: str = "--link") -> Link:
    preset = PRESETS.get(str(text).strip().lower())
    if preset:
        return preset
    try:
        rate_bps = parse_rate(text, key)
    except ConfigError as exc:
        raise ConfigError(key, text, f"must be a preset ({', '.join(p.name for p in PRESETS.values())}) or a rate such as 100mbit",
                          hint=exc.hint) from None
    return Link(str(text).strip(), float(rate_bps), DEFAULT_ALPHA_S)


def _check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ConfigError("--collective", collective, f"must be one of {', '.join(COLLECTIVES)}")


def busbw_factor(n: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus-bandwidth factor; 0 for one rank (nothing crosses a link)."""
    _check_collective(collective)
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def bytes_per_rank(payload_bytes: float, n: int, collective: str = "allreduce") -> float:
    return busbw_factor(n, collective) * payload_bytes


def collective_time_s(payload_bytes: float, n: int, link: Link, efficiency: float = DEFAULT_EFFICIENCY,
                      collective: str = "allreduce") -> float:
    if n <= 1:
        return 0.0
    hops = 2 * (n - 1) if collective == "allreduce" else n - 1
    return bytes_per_rank(payload_bytes, n, collective) * 8 / (link.rate_bps * efficiency) + hops * link.alpha_s


def step_report(params: float, dtype: str, n: int, links: list[Link], compute_s: float | None = None,
                grad_accum: int = 1, efficiency: float = DEFAULT_EFFICIENCY, collective: str = "allreduce") -> list[dict]:
    """One row per link: what one gradient synchronisation costs, and against the compute."""
    if not params > 0:
        raise ConfigError("--params", params, "must be a positive number of parameters, e.g. 760e6")
    if dtype not in DTYPE_BYTES:
        raise ConfigError("--dtype", dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
    if n < 1:
        raise ConfigError("--nodes", n, "must be at least 1")
    if not 0 < efficiency <= 1:
        raise ConfigError("--efficiency", efficiency, "must be in (0, 1]")
    if grad_accum < 1:
        raise ConfigError("--grad-accum", grad_accum, "must be at least 1")
    if compute_s is not None and not compute_s > 0:
        raise ConfigError("--compute-s", compute_s, "must be a positive number of seconds")
    _check_collective(collective)
    payload = params * DTYPE_BYTES[dtype]
    rows = []
    for link in links:
        comm_s = collective_time_s(payload, n, link, efficiency, collective)
        row = {"link": link.name, "rate_bps": link.rate_bps, "payload_bytes": payload,
               "bytes_per_rank": bytes_per_rank(payload, n, collective), "comm_s": comm_s}
        if compute_s is not None:
            # Gradients are synchronised once per optimizer step, after grad_accum micro-steps.
            row["comm_over_compute"] = comm_s / (grad_accum * compute_s)
            row["step_s_no_overlap"] = grad_accum * compute_s + comm_s
        rows.append(row)
    return rows


_PARAM_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_params(text: str) -> float:
    """'760e6', '760M', '1.3B' -> a parameter count."""
    raw = str(text).strip().lower()
    scale = _PARAM_SUFFIX.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in _PARAM_SUFFIX else raw
    try:
        params = float(number) * scale
    except ValueError:
        raise ConfigError("--params", text, "must be a parameter count such as 760e6, 760M or 1.3B") from None
    if not 1 <= params < 1e15:
        raise ConfigError("--params", text, "must be from 1 to 1e15 parameters")
    return params
