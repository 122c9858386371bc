"""Fixtures the unit tests share."""

import pytest


@pytest.fixture
def refusal(monkeypatch, capsys):
    """The trainer's flags refused before any process group exists: refusal(argv, world, local) parses
    them as a rank of `world` ranks, `local` to a node, checks they exit 2, and returns the message."""
    from trainer.flags import parse_args

    def refused(argv: list[str], world: int = 1, local: int = 1) -> str:
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
        return capsys.readouterr().err

    return refused
