"""The example's own switch: the test that fails on purpose runs only when asked."""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-failing-example", action="store_true",
                     help="also run the test that fails on purpose, to see a failing rank named in the report "
                          "(or set DDPCI_RUN_FAILING=1)")


def pytest_configure(config):
    loaded = config.pluginmanager.has_plugin("ddplab") or config.pluginmanager.has_plugin("labctl.pytest_plugin")
    if not loaded:
        raise pytest.UsageError("these tests need ddplab's pytest plugin (the ddp_lab fixture): installing ddplab "
                                "registers it (`pip install -e .` in the checkout), or load it with "
                                "`-p labctl.pytest_plugin`; was it turned off with -p no:ddplab?")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-failing-example") or os.environ.get("DDPCI_RUN_FAILING") == "1":
        return
    skip = pytest.mark.skip(reason="fails on purpose; --run-failing-example runs it")
    for item in items:
        if item.get_closest_marker("failing_example"):
            item.add_marker(skip)
