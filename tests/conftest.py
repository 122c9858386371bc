"""What every test here needs of the host: torch, for the tests that run the trainer on this machine.

labctl itself needs no torch (the nodes bring their own), so `make demo` leaves it out of .venv;
`make test` adds its CPU build (`make host-torch`). Without it the trainer's tests cannot import,
and one clear line is better than a screen of ImportErrors.
"""

import importlib.util

import pytest


def pytest_configure(config):
    if importlib.util.find_spec("torch") is None:
        pytest.exit("the tests run the trainer on this machine and need torch in this Python: `make host-torch` "
                    "installs its CPU build into .venv (`make test` does it for you)", returncode=1)
