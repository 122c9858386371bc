"""Owner labels and `labctl gc`'s verdicts, against real processes of this machine (no engine)."""

import os
import socket
import subprocess
import sys

from labctl.lab.garbage import plan_gc
from labctl.lab.listing import LabListing
from labctl.lab.owner import (
    LABEL_HOST,
    LABEL_PID,
    LABEL_PID_NS,
    LABEL_PID_START,
    LABEL_SESSION,
    LABEL_USER,
    owner_gone,
    owner_of,
    process_start,
)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_cli_lab_has_an_owner_but_no_owner_process():
    labels = owner_of({}, "cli").labels()
    assert labels[LABEL_SESSION] == "cli" and labels[LABEL_HOST] == socket.gethostname() and labels[LABEL_USER]
    assert LABEL_PID not in labels and owner_gone(labels) is None


def test_an_owner_process_is_named_by_the_environment_or_the_caller():
    from_env = owner_of({"DDPLAB_OWNER_PID": str(os.getpid()), "DDPLAB_OWNER_SESSION": "pytest-1a2b"}, "api").labels()
    assert from_env[LABEL_PID] == str(os.getpid()) and from_env[LABEL_SESSION] == "pytest-1a2b"
    assert from_env[LABEL_PID_START] == process_start(os.getpid()) and owner_gone(from_env) is None
    assert owner_of({}, "api", pid=os.getpid()).labels()[LABEL_SESSION] == "api"


def test_a_dead_owner_is_gone_and_a_reused_pid_is_not_its_owner():
    pid = dead_pid()
    labels = owner_of({}, "api", pid=os.getpid()).labels()
    assert owner_gone({**labels, LABEL_PID: str(pid)}).startswith(f"its owner, process {pid} (api), has exited")
    reused = {**labels, LABEL_PID_START: "1"}  # this process, but started at another time: not the owner
    assert "the pid is another's now" in owner_gone(reused)


def test_a_killed_owner_not_yet_reaped_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start(child.pid) is not None
        child.kill()
        deadline = __import__("time").monotonic() + 10
        while __import__("time").monotonic() < deadline:  # until the kernel has made it a zombie
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        assert process_start(child.pid) is None  # a zombie has exited: its labs are gc's
    finally:
        child.wait()


def test_an_owner_on_another_machine_or_in_another_container_is_never_judged_from_here():
    dead = owner_of({}, "api", pid=dead_pid()).labels()
    assert owner_gone(dead) is not None
    assert owner_gone({**dead, LABEL_HOST: "elsewhere"}) is None
    # Another PID namespace (a container sharing the engine) or another boot: its pids are not ours.
    assert owner_gone({**dead, LABEL_PID_NS: "another-boot/pid:[4026531836]"}) is None
    assert owner_gone({k: v for k, v in dead.items() if k != LABEL_PID_NS}) is None


def test_gc_removes_only_labs_whose_owner_is_gone_and_all_with_everything():
    alive = owner_of({}, "pytest-x", pid=os.getpid()).labels()
    labs = [LabListing("cli", 3, 3, 1.0, "/ws", owner=owner_of({}, "cli").labels()),
            LabListing("mine", 2, 2, 1.0, "/ws", owner=alive),
            LabListing("crashed", 2, 2, 1.0, "/ws", owner={**alive, LABEL_PID: str(dead_pid())}),
            LabListing("old", 0, 0, None, "/ws", volumes=["old-shared"])]
    verdicts = {v.lab: v for v in plan_gc(labs)}
    assert [name for name, v in verdicts.items() if v.remove] == ["crashed"]
    assert "has exited" in verdicts["crashed"].why and "is alive" in verdicts["mine"].why
    assert "no owner process (from cli)" in verdicts["cli"].why and "no owner labels" in verdicts["old"].why
    assert all(v.remove for v in plan_gc(labs, everything=True))


def test_a_subnet_race_keeps_the_owner_labels_on_the_next_attempt(tmp_path, monkeypatch):
    # Another lab took the picked subnet between the pick and Compose creating the network: `up`
    # plans again on a new subnet, and that plan must still carry the owner (gc judges labs by it).
    from labctl.errors import CommandError
    from labctl.lab import up
    from labctl.spec.labspec import load_config

    config = load_config(tmp_path, {}, {"lab": "race"})
    owner = {LABEL_USER: "someone", LABEL_PID: "4242"}
    planned, attempts = [], []

    def render_project(client, config, workspace, inputs, raced=()):
        planned.append((dict(inputs.owner or {}), inputs.tcp_cc, list(raced)))
        return {"services": {}}, {}, "172.28.1.0/24"

    def apply_up(client, config, workspace, document, env_files, report, engine, started):
        attempts.append(started)
        if len(attempts) == 1:
            raise CommandError(["docker", "compose", "up"], 1, "", "Pool overlaps with other one on this address space")
        return []

    monkeypatch.setattr(up, "render_project", render_project)
    monkeypatch.setattr(up, "apply_up", apply_up)
    plan = up.UpPlan(config, engine=None, existing=False, document={}, env_files={}, subnet="172.28.0.0/24",
                     public_key=None, gpus=None, tcp_cc="cubic", owner=owner)
    applied, _ = up.apply_up_plan(None, plan, tmp_path, lambda message: None)
    assert planned == [(owner, "cubic", ["172.28.0.0/24"])] and applied.owner == owner and applied.subnet == "172.28.1.0/24"
    assert [a.rsplit(" ", 1)[-1] for a in attempts] == ["172.28.0.0/24", "172.28.1.0/24"]


def test_a_subnet_lost_to_a_concurrent_up_is_not_picked_again_though_it_looks_free(tmp_path):
    # A fresh clone's make test: a lab picked 172.28.0.0/24 twice and 172.28.1.0/24 twice, each time
    # refused by Docker ("Pool overlaps") and each time listed free again by the engine a moment later.
    from labctl.lab.up import choose_subnet
    from labctl.spec.labspec import load_config

    class Engine:  # no network at all: what the engine listed between the attempts
        class networks:
            @staticmethod
            def list(**filters):
                return []

    config = load_config(tmp_path, {}, {"lab": "race"})
    assert choose_subnet(Engine, config) == "172.28.0.0/24"
    assert choose_subnet(Engine, config, ["172.28.0.0/24", "172.28.1.0/24"]) == "172.28.2.0/24"


def test_a_scenario_lab_is_planned_as_up_plans_one_and_owned_by_the_scenario(tmp_path, monkeypatch):
    # `labctl scenario` brings up a throwaway lab through `up`'s own bring-up: the same TCP congestion
    # control as `up` gives, the other torch on the last node where the scenario asks, and this
    # process as its owner, so that `labctl gc` removes the lab a killed scenario left.
    from types import SimpleNamespace

    from labctl.api import bringup, scenarios
    from labctl.engine.detect import Engine
    from labctl.lab import up
    from labctl.session import LabSession
    from labctl.spec.labspec import load_config

    config = load_config(tmp_path, {}, {"lab": "scenario-x", "nodes": "2"})
    engine = Engine(kind="docker", product="Docker Engine", version="27", endpoint="unix:///var/run/docker.sock",
                    context=None, os="Debian", arch="x86_64", cpus=2, engine_id="x")
    rendered, brought = [], []

    def render_project(client, config, workspace, inputs):
        rendered.append((dict(inputs.owner or {}), inputs.gpus, inputs.tcp_cc))
        return {"services": {}}, {}, "172.28.0.0/24"

    monkeypatch.setattr(up, "render_project", render_project)
    monkeypatch.setattr(up, "plan_tcp", lambda config, engine: ("cubic", None))
    monkeypatch.setattr(bringup.engine_mod, "usable_engine", lambda client: engine)
    monkeypatch.setattr(bringup, "lab_nodes", lambda client, lab: [])
    assert scenarios.plan_up is bringup.plan_up and scenarios.bring_up is bringup.bring_up  # one bring-up
    monkeypatch.setattr(scenarios, "bring_up", lambda session, plan, report: brought.append(plan)
                        or SimpleNamespace(nodes=[]))
    scenarios.scenario_up(LabSession(config, tmp_path, object()), {"node1": "ddplab-node:other"}, lambda message: None)
    (owner, gpus, tcp_cc), = rendered
    (plan,) = brought
    assert (owner[LABEL_SESSION], owner[LABEL_PID], tcp_cc) == ("scenario", str(os.getpid()), "cubic")
    assert [n.image for n in gpus.nodes] == [config.image_tag, "ddplab-node:other"] and plan.owner == owner
