"""The trainer's --strategy flag (trainer/strategy.py): what does not go with it is refused before
any process group exists. The strategies train on a real 3-node lab in
tests/integration/test_training.py."""

import pytest

from trainer.flags import parse_args


@pytest.mark.parametrize("argv, fragment", [
    (["--strategy", "fsdp", "--ckpt-every", "5"], "--ckpt-every with --strategy fsdp"),
    (["--strategy", "zero", "--ckpt-every", "5"], "--ckpt-every with --strategy zero"),
    (["--strategy", "fsdp", "--comm-hook", "fp16"], "--comm-hook fp16 is a DDP setting"),
    (["--strategy", "fsdp", "--static-graph"], "--static-graph is a DDP setting"),
    (["--strategy", "hsdp"], "invalid choice: 'hsdp'"),
])
def test_flags_that_do_not_go_with_a_strategy_are_refused_before_anything_starts(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and fragment in capsys.readouterr().err
