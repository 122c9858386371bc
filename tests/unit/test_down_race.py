"""`down` and `gc` of one lab from two processes at once: a container the other process is already
removing (the engine's 409 "removal ... already in progress", seen in a fresh-clone `make test`
where `gc` met a test's own `down`) counts as going, and is waited for, not an error. The same for
a `shape --duration` undo that a later shape cancels just as it removes itself."""

from __future__ import annotations

import docker.errors
import pytest

from labctl.lab import lifecycle


def refusal(status: int, message: str, container_id: str) -> docker.errors.APIError:
    """The SDK's error for an engine's answer of `status` with `message`, as remove_container raises it."""
    response = type("R", (), {"status_code": status, "reason": "Conflict",
                              "url": f"http+docker://localhost/containers/{container_id}"})()
    return docker.errors.APIError(message, response=response, explanation=message)


class Engine:
    """The Docker API calls apply_down makes, answering as an engine does while another client removes c1."""

    def __init__(self):
        self.inspected = 0
        self.api = self

    def remove_container(self, container_id, force):
        raise refusal(409, f"removal of container {container_id} is already in progress", container_id)

    def inspect_container(self, container_id):
        self.inspected += 1
        if self.inspected >= 3:
            raise docker.errors.NotFound("gone")
        return {"Id": container_id}


def test_a_container_another_process_is_removing_is_waited_for(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(lifecycle, "kill_orphaned_compose", lambda lab: 0)
    monkeypatch.setattr(lifecycle, "lab_containers", lambda client, lab: [{"Id": "c1", "Names": ["/demo-node0"]}])
    monkeypatch.setattr(lifecycle, "lab_networks", lambda client, lab: [])
    assert lifecycle.apply_down(engine, "demo") == {"containers": 0, "networks": 0, "volumes": 0}
    assert engine.inspected == 3


def test_any_other_refusal_still_fails(monkeypatch):
    engine = Engine()
    engine.remove_container = lambda container_id, force: (_ for _ in ()).throw(refusal(500, "boom", container_id))
    monkeypatch.setattr(lifecycle, "kill_orphaned_compose", lambda lab: 0)
    monkeypatch.setattr(lifecycle, "lab_containers", lambda client, lab: [{"Id": "c1", "Names": ["/demo-node0"]}])
    with pytest.raises(docker.errors.APIError):
        lifecycle.apply_down(engine, "demo")


class UndoEngine:
    """The calls cancel_undos makes: one pending undo of node0, which the engine is removing already
    (it fired, cleared the link and is removing itself: auto_remove), as seen in a fresh-clone make test."""

    def __init__(self, status: int, message: str):
        self.api, self.status, self.message = self, status, message

    def containers(self, all, filters):
        return [{"Id": "u1", "Labels": {"io.ddplab.target": "node0"}}]

    def remove_container(self, container_id, force):
        raise refusal(self.status, self.message, container_id)


def test_a_later_shape_cancels_an_undo_that_is_removing_itself_without_an_error():
    from labctl.net import apply

    apply.cancel_undos(UndoEngine(409, "removal of container u1 is already in progress"), "demo", ["node0"])
    with pytest.raises(docker.errors.APIError):  # any other refusal still fails
        apply.cancel_undos(UndoEngine(409, "conflict: something else"), "demo", ["node0"])
