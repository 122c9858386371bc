"""worker.py's fast_method_name for torch's dynamic rendezvous: the name torch's own get_method_name
gives (inspect.stack()[depth].function), got by walking frames, and put in place whether the
rendezvous module is imported already (a forked agent) or later (a cold one)."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from labctl.remote import worker

rendezvous = importlib.import_module(worker.RENDEZVOUS)
TORCHS = rendezvous.get_method_name if rendezvous.get_method_name is not worker.fast_method_name else None


def record(namer, depth):
    """As torch's _record calls it: the name of the function that called record()."""
    return namer(depth)


def an_event(namer, depth=2):
    return record(namer, depth)


@pytest.mark.skipif(TORCHS is None, reason="this process's rendezvous module has the fast name already")
@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_the_frame_walk_names_what_torchs_inspect_stack_names(depth):
    assert an_event(worker.fast_method_name, depth) == an_event(TORCHS, depth).replace("get_method_name",
                                                                                      "fast_method_name")
    assert an_event(worker.fast_method_name) == "an_event"


def test_a_stack_too_short_is_named_as_torch_names_it():
    assert worker.fast_method_name(sys.getrecursionlimit() + 10) == "no_method_name"
    if TORCHS is not None:
        assert TORCHS(10_000) == "no_method_name"


def test_the_rendezvous_module_gets_the_fast_name_when_it_is_imported_already(monkeypatch):
    monkeypatch.setattr(rendezvous, "get_method_name", TORCHS or worker.fast_method_name)
    worker.after_import(worker.RENDEZVOUS, worker.quicken_rendezvous)  # a forked agent: in sys.modules
    assert rendezvous.get_method_name is worker.fast_method_name


def test_only_a_module_that_has_the_function_is_changed():
    bare = types.SimpleNamespace()
    worker.quicken_rendezvous(bare)
    assert not hasattr(bare, "get_method_name")
    odd = types.SimpleNamespace(get_method_name="not a function")
    worker.quicken_rendezvous(odd)
    assert odd.get_method_name == "not a function"
