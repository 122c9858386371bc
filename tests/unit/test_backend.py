"""--backend auto|nccl|gloo: one choice for every rank of a mixed lab, and a clear word when it cannot be had."""

import pytest

from trainer import backend
from trainer.flags import parse_args


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("DDPLAB_BACKEND", raising=False)


@pytest.mark.parametrize("requested, cuda, expected", [
    ("auto", True, ("nccl", "cuda")),
    ("auto", False, ("gloo", "cpu")),
    ("gloo", True, ("gloo", "cpu")),  # a GPU node of a mixed lab trains on its CPU, as its peers do
    ("gloo", False, ("gloo", "cpu")),
    ("nccl", True, ("nccl", "cuda")),
])
def test_the_choice_and_its_device(no_env, requested, cuda, expected):
    choice = backend.resolve(requested, cuda_available=cuda)
    assert (choice.backend, choice.device_type) == expected
    assert choice.reason  # said at start-up


def test_gloo_on_a_gpu_machine_says_so(no_env):
    assert "although CUDA is available" in backend.resolve("gloo", cuda_available=True).reason


def test_auto_without_nccl_in_torch_falls_back_to_gloo(no_env):
    assert backend.resolve("auto", cuda_available=True, nccl_available=False).backend == "gloo"


def test_nccl_without_cuda_is_refused_with_the_way_out(no_env):
    with pytest.raises(SystemExit, match=r"--backend nccl needs a CUDA GPU.*use --backend gloo"):
        backend.resolve("nccl", cuda_available=False)
    with pytest.raises(SystemExit, match="has no NCCL"):
        backend.resolve("nccl", cuda_available=True, nccl_available=False)


def test_the_default_is_the_labs_word_then_auto(monkeypatch):
    monkeypatch.setenv("DDPLAB_BACKEND", "gloo")
    assert backend.resolve(None, cuda_available=True).backend == "gloo"
    monkeypatch.setenv("DDPLAB_BACKEND", "NCCL")
    with pytest.raises(SystemExit, match="DDPLAB_BACKEND=nccl needs a CUDA GPU"):
        backend.resolve(None, cuda_available=False)
    monkeypatch.setenv("DDPLAB_BACKEND", "mpi")
    with pytest.raises(SystemExit, match="DDPLAB_BACKEND must be one of auto, nccl, gloo, got 'mpi'"):
        backend.resolve(None, cuda_available=False)
    monkeypatch.setenv("DDPLAB_BACKEND", "")
    assert backend.resolve(None, cuda_available=False).reason == "auto: no CUDA device"


def test_the_flag(no_env, capsys):
    assert parse_args([]).backend is None  # resolved at start-up: $DDPLAB_BACKEND, else auto
    assert parse_args(["--backend", "gloo"]).backend == "gloo"
    with pytest.raises(SystemExit):
        parse_args(["--backend", "mpi"])
    assert "expected one of auto, nccl, gloo, got 'mpi'" in capsys.readouterr().err


def test_compute_init_on_gloo_uses_the_cpu(no_env, monkeypatch):
    from trainer import dist

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dist.torch.cuda, "is_available", lambda: True)  # a GPU machine, as far as the choice goes
    c = dist.compute_init(10, "gloo")
    assert c.device.type == "cpu" and "although CUDA is available" in c.reason


def test_bench_allreduce_takes_the_flag(no_env):
    from trainer.bench_allreduce import parse_args as bench_args

    assert bench_args(["--sizes", "1024", "--backend", "nccl"]).backend == "nccl"
