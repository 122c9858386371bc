"""The classic traps, reproduced on purpose on a throwaway lab, diagnosed, fixed.

Each scenario: bring up a fresh 2-node lab, break it the way people break real clusters, run
the trainer the way they would (bare torchrun or a static launch, with short timeouts instead of
torch's minutes), show the symptom exactly as torch prints it and how long it took to show, show
what `labctl doctor` says about the same configuration, apply the fix, run again to success, and
remove the lab. A "break" is an environment (what the user exported or wrote in an env file) plus,
for some traps, a change to the machine (a firewall rule, a second network, a CPU limit): the
traps are defined, as data, in traps.py. Where a trap is about time (the straggler), the broken
run's timeline (labctl trace) joins the diagnosis, and that run's folder, with the picture, is kept
in .lab/scn-NAME/runs/ when the rest of the lab goes.

The runner sits beside the traps; the one thing it needs from above is `up` (labctl.api.scenarios
hands it the API's bring-up, the same one `labctl up` goes through): each scenario's lab is brought
up exactly as a user's would be.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from labctl.core import assets
from labctl.core.ui import Report
from labctl.diagnose import doctor
from labctl.diagnose.traps import SCENARIOS, Context, Env, Scenario
from labctl.engine.labels import container_name
from labctl.errors import ConfigError, LabError
from labctl.image.base import TARGET_CACHE, node_target
from labctl.image.image import ensure_mismatch_image
from labctl.image.lockfile import read_lab_lock
from labctl.image.packages import LOCK_FILE
from labctl.image.resolve import fetch_requirement
from labctl.lab import lifecycle as lab_mod
from labctl.net.overlay import NONE
from labctl.run.launch import Launch, network_env, run_env
from labctl.run.plan import RunPlan, new_run
from labctl.session import LabSession
from labctl.trace import write_trace

__all__ = ["SCENARIOS", "ScenarioOutcome", "Up", "run_scenario", "run_scenarios", "scenario_overlays", "select_scenarios"]

# How a scenario's lab comes up: (its session, node -> another image or None, where progress goes) -> its nodes.
Up = Callable[[LabSession, "dict[str, str] | None", Report], list]


# ------------------------------------------------------------------------------ running one


@dataclass
class ScenarioOutcome:
    name: str
    symptom: str
    seconds_to_show: float
    broken_exit: int | None
    doctor: list[str]
    doctor_seconds: float
    fix: str
    fixed_ok: bool
    fixed_seconds: float
    total_seconds: float
    bound_s: int

    symptom_required: bool = True
    timeline: str = ""  # the broken run's timeline: who the others waited for, and the picture's path
    overlay: str = NONE  # the network it was met on: the bridge, or a mesh VPN over it (`up --overlay`)

    @property
    def ok(self) -> bool:
        shown = bool(self.symptom) or not self.symptom_required
        return self.fixed_ok and shown and bool(self.doctor) and self.total_seconds <= self.bound_s


def scenario_plan(ctx: Context, scenario: Scenario, env: Env, run_dir, node_env: dict,
                  timeout_s: float | None = None) -> RunPlan:
    """One run of the scenario as a plan: every node's own launch environment (`env`, the trap or its
    fix) over the run's and the network's (on a lab with an overlay: the tunnel's interface and node0's
    address on it, as labctl's own runs have them), and no rendezvous store of labctl's: the scenario
    sets the rendezvous itself. `timeout_s`: the run is stopped after this long (the plan carries its
    time limit)."""
    argv = (["torchrun"] if scenario.launcher == "torchrun" else ["python"]) + scenario.trainer
    common = run_env(ctx.run_id, run_dir)

    def network(node: str) -> dict[str, str]:
        mine = node_env.get(node, {})
        return {**network_env(mine), **({"MASTER_ADDR": mine["MASTER_ADDR"]} if "MASTER_ADDR" in mine else {})}

    launches = [Launch(node, node, argv, {**common, "OMP_NUM_THREADS": "1", **network(node), **env[node]})
                for node in ctx.names]
    return RunPlan(ctx.run_id, run_dir, node_env, launches, store=False, timeout_s=timeout_s)


def group_findings(findings) -> list[str]:
    """One line per distinct problem, naming every node it was found on."""
    by_message: dict[str, list[str]] = {}
    for f in findings:
        by_message.setdefault(f.message, []).append(f.node)
    return [msg if nodes == ["all"] else f"{', '.join(n for n in nodes if n != 'all')}: {msg}"
            for msg, nodes in by_message.items()]


def first_symptom(pattern: str, outcomes) -> str:
    regex = re.compile(pattern)
    for outcome in outcomes:
        for line in outcome.lines:
            match = regex.search(line)
            if match:
                return match.group(0).strip()[:300]
    return ""


def symptom_remains(scenario: Scenario, broken: str, fixed: str) -> bool:
    """Whether the fixed run still shows the problem: its symptom line at all, or as the scenario judges it."""
    if not fixed:
        return False
    return scenario.still_there(broken, fixed) if scenario.still_there else True


def run_scenario(client, config, workspace, scenario: Scenario, report, up: Up) -> ScenarioOutcome:
    """The whole story on a throwaway lab (config.lab), brought up with `up` and removed whatever happens."""
    timeline, kept = "", None
    config, other_image, drift = prepared(client, config, scenario, report)
    started = time.monotonic()
    lab_mod.apply_down(client, config.lab, volumes=True)
    try:
        session = LabSession(config, workspace, client)
        images = {config.node_names[-1]: other_image} if other_image else None
        nodes = up(session, images, lambda message: report(f"{scenario.name}: {message}"))
        ctx = Context(client, config.lab, nodes, config.iface, overlay=session.overlay_spec(),
                      notes={"drift": drift} if drift else {})
        node_env = session.node_env(ctx.names)  # up's env files (on the tunnel, with an overlay): both runs'
        if scenario.prepare:
            scenario.prepare(ctx)
        ctx.run_id, run_dir = new_run(session.directory)
        broken_env = scenario.broken(ctx)
        report(f"{scenario.name}: the broken run ({scenario.launcher})")
        t0 = time.monotonic()
        limit = max(10.0, scenario.bound_s - (t0 - started) - 40)
        broken = session.execute(scenario_plan(ctx, scenario, broken_env, run_dir, node_env, limit),
                                 echo=False, check=False)
        failed = [o for o in broken.outcomes if o.exit_code not in (0, None)]
        shown_at = min((o.ended for o in failed if o.ended), default=None) or max(o.ended or t0 for o in broken.outcomes)
        symptom = first_symptom(scenario.symptom, broken.outcomes)
        broken_exit = max((o.exit_code or 0 for o in broken.outcomes), default=0)

        report(f"{scenario.name}: labctl doctor on the same configuration")
        doctor_s, diagnosis = diagnose_broken(session, ctx, node_env, broken_env)
        if scenario.timeline:
            report(f"{scenario.name}: labctl trace of the broken run")
            timeline, kept = broken_timeline(run_dir)

        apply_fix(ctx, scenario, session, (other_image, drift), up)
        ctx.run_id, run_dir = new_run(session.directory)
        report(f"{scenario.name}: the fixed run")
        t1 = time.monotonic()
        fixed = session.execute(scenario_plan(ctx, scenario, scenario.fixed(ctx), run_dir, node_env,
                                              max(10.0, scenario.bound_s - (t1 - started))), echo=False, check=False)
        fixed_s = time.monotonic() - t1
        # fixed means it succeeded, and where it succeeds either way, that the symptom is gone
        fixed_ok = fixed.ok and not (scenario.fixed_without_symptom
                                     and symptom_remains(scenario, symptom, first_symptom(scenario.symptom, fixed.outcomes)))
    finally:
        lab_mod.apply_down(client, config.lab, volumes=True)
        remove_lab_folder(lab_mod.lab_dir(workspace, config.lab), keep=kept)
    return ScenarioOutcome(scenario.name, symptom, shown_at - t0, broken_exit, diagnosis, doctor_s, scenario.fix, fixed_ok,
                           fixed_s, time.monotonic() - started, scenario.bound_s, scenario.symptom_required, timeline,
                           config.overlay or NONE)


def diagnose_broken(session: LabSession, ctx: Context, node_env: Env, broken_env: Env) -> tuple[float, list[str]]:
    """(seconds, one line per problem): doctor on the broken configuration, every node's environment
    as the broken run read it: its env file (on the tunnel, with an overlay) and the trap's."""
    seen = {node: {**node_env.get(node, {}), **broken_env[node]} for node in ctx.names}
    lock = read_lab_lock(session.directory / LOCK_FILE)
    found = doctor.diagnose(ctx.client, ctx.lab, ctx.nodes, session.subnet(), env_overrides=seen,
                            lock=("the lab's lock", lock) if lock else None)
    return found.seconds, group_findings(found.problems)


def prepared(client, config, scenario: Scenario, report) -> tuple:
    """(the scenario's lab spec, the other torch's image, the drifting wheel): what is fetched or
    built once and cached, before the scenario's clock starts."""
    other_image = ensure_mismatch_image(client, config, report) if scenario.other_torch_on_last_node else None
    if scenario.packages:
        config = replace(config, with_packages=scenario.packages,
                         sources={**config.sources, "with_packages": "the scenario"})
    drift = download_requirement(client, config, scenario.drift, report) if scenario.drift else None
    return config, other_image, drift


def apply_fix(ctx: Context, scenario: Scenario, session: LabSession, odd: tuple[str | None, Path | None],
              up: Up) -> None:
    """The fix, before the fixed run: the scenario's repair, and every node back on the lab's image
    (`up` again recreates the odd node, `odd` = (the other torch's image, the drifting wheel): on
    another torch, or changed by hand in its container)."""
    other_image, drift = odd
    if scenario.repair:
        scenario.repair(ctx)
    if drift:
        ctx.client.containers.get(container_name(session.name, session.config.node_names[-1])).remove(force=True)
    if other_image or drift:
        ctx.nodes = up(session, None, lambda _m: None)


def download_requirement(client, config, requirement: str, report) -> Path:
    """The wheel of one pinned requirement for the nodes' Python, in the package cache (fetched once)."""
    cache = assets.cache_dir(config.cache_dir)
    target = node_target(client, config.image_tag, report, cache / TARGET_CACHE)
    return fetch_requirement(requirement, cache, target)


def broken_timeline(run_dir: Path) -> tuple[str, Path | None]:
    """(labctl trace's verdict on the broken run and its picture's path; the run folder to keep, or
    None). A run that left nothing to draw says so: the trap is shown either way."""
    try:
        traced = write_trace(run_dir)
    except LabError as exc:
        return f"no timeline: {exc.message}", None
    picture = f"timeline: {traced.png}" if traced.png else "; ".join(traced.notes)
    return f"{traced.verdict()}; {picture}", run_dir


def remove_lab_folder(folder: Path, keep: Path | None) -> None:
    """The scenario lab's folder goes: all of it, or all but `keep`, one of its run folders (runs/<id>)."""
    folder, keep = folder.resolve(), keep and keep.resolve()
    if keep is None or keep.parent.parent != folder:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in [*[p for p in folder.iterdir() if p != keep.parent], *[p for p in keep.parent.iterdir() if p != keep]]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def select_scenarios(names) -> list[str]:
    """The scenarios asked for (`all` for every one), each once, in the order given."""
    wanted = list(SCENARIOS) if list(names) == ["all"] else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in SCENARIOS]
    if unknown:
        raise LabError(f"no scenario {', '.join(map(repr, unknown))}", hint=f"one of: {', '.join(SCENARIOS)}, or all")
    return wanted


def scenario_overlays(names: list[str], asked: str | None) -> dict[str, str]:
    """Each scenario's overlay: the one asked for (`scenario run --overlay`), else its own default. A
    scenario that cannot be met on the one asked for is refused before any starts."""
    refused = [n for n in names if asked and asked not in SCENARIOS[n].overlays]
    if refused:
        can = "; ".join(f"{n} on {', '.join(SCENARIOS[n].overlays)}" for n in refused)
        raise ConfigError("--overlay", asked, f"not a network these scenarios can be met on: {can}",
                          hint="leave --overlay out: each scenario brings up the network it needs")
    return {n: asked or SCENARIOS[n].overlays[0] for n in names}


def scenario_lab(name: str, overlay: str | None = None) -> str:
    """The lab a scenario runs on: scn-NAME on its own network, scn-NAME-OVERLAY on another one asked
    for (`scenario run wrong-nic --overlay tailscale`), so that the two can run side by side."""
    own = SCENARIOS[name].overlays[0]
    return f"scn-{name}" if overlay in (None, own) else f"scn-{name}-{overlay}"


def run_scenarios(client, make_config, workspace, names: list[str], report, up: Up, show=None,
                  overlay: str | None = None) -> list[ScenarioOutcome]:
    """Each scenario on a 2-node lab of its own, scenario_lab's (`make_config(lab=...)` resolves its
    configuration), on the overlay it needs or `overlay` (scenario_overlays); `show` gets each outcome as
    soon as it is known. A scenario's runs start torchrun or python themselves, as the trap needs,
    never through a fork server, so its lab asks `up` for none (`warm` off: two torch imports fewer on
    the machine while the scenario's clock runs). `up(session, images, report)` brings a lab up."""
    overlays, outcomes = scenario_overlays(names, overlay), []
    for name in names:
        spec = make_config(lab=scenario_lab(name, overlays[name]))
        kind = None if overlays[name] == NONE else overlays[name]
        config = replace(spec, nodes=2, warm="off", overlay=kind,
                         sources={**spec.sources, "nodes": "the scenario", "warm": "the scenario",
                                  "overlay": "the scenario"})
        outcomes.append(run_scenario(client, config, workspace, SCENARIOS[name], report, up))
        if show:
            show(outcomes[-1])
    return outcomes
