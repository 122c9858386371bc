"""`fault pause` tries again while cgroup v1's freezer is busy, and says so when it stays busy."""

import docker.errors
import pytest

from labctl.errors import StateError
from labctl.net.faults import freeze

BUSY = "Cannot pause container 54ed: OCI runtime pause failed: unable to freeze: unknown"


class Container:
    """The one method freeze() calls, failing as the engine does for its first `busy` calls."""

    def __init__(self, busy: int, message: str = BUSY):
        self.busy, self.message, self.calls = busy, message, 0

    def pause(self):
        self.calls += 1
        if self.calls <= self.busy:
            raise docker.errors.APIError("500 Server Error", explanation=self.message)


def test_a_busy_freezer_is_tried_again_until_the_node_freezes():
    container = Container(busy=2)
    freeze(container, "node2", tries=5, pause_s=0)
    assert container.calls == 3


def test_a_freezer_busy_through_every_try_is_a_state_error_that_names_the_node():
    container = Container(busy=9)
    with pytest.raises(StateError, match=r"node2 would not freeze.*3 tries"):
        freeze(container, "node2", tries=3, pause_s=0)
    assert container.calls == 3


def test_any_other_refusal_is_not_retried():
    container = Container(busy=1, message="container 54ed is not running")
    with pytest.raises(docker.errors.APIError, match="not running"):
        freeze(container, "node2", tries=5, pause_s=0)
    assert container.calls == 1
