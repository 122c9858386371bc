"""The trainer's --strategy flag (trainer/strategy.py): what does not go with it is refused before
any process group exists. Checkpoints resuming under torchrun on this machine, and hsdp, are in
tests/host/test_strategy.py; the strategies train on a real 3-node lab in tests/integration/test_training.py."""

import pytest

from trainer.flags import parse_args


@pytest.mark.parametrize("argv, fragment", [
    (["--strategy", "fsdp", "--comm-hook", "fp16"], "--comm-hook fp16 is a DDP setting"),
    (["--strategy", "fsdp", "--static-graph"], "--static-graph is a DDP setting"),
    (["--strategy", "tp"], "invalid choice: 'tp'"),
    (["--strategy", "hsdp", "--static-graph"], "--static-graph is a DDP setting, and --strategy hsdp"),
    (["--strategy", "fsdp", "--compile"], "--compile compiles the model before DDP wraps it, and --strategy fsdp"),
    (["--strategy", "hsdp", "--compile"], "use --strategy ddp or zero"),
])
def test_flags_that_do_not_go_with_a_strategy_are_refused_before_anything_starts(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and fragment in capsys.readouterr().err


def test_compile_goes_with_ddp_and_zero():
    assert parse_args(["--compile"]).compile and parse_args(["--compile", "--strategy", "zero"]).compile
    assert not parse_args([]).compile


def test_hsdp_needs_more_than_one_process_on_a_node(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--strategy", "hsdp"])
    assert exc.value.code == 2 and "labctl run --nproc-per-node 2" in capsys.readouterr().err
