"""A pipeline-parallel script of your own: torch.distributed.pipelining, one stage per rank, nothing of
ddplab's. Each rank holds a contiguous share of the model's layers; the schedule (GPipe or 1F1B) sends
each micro-batch's activations forward to the next rank and their gradients back.

    labctl run -- examples/pipeline/my_pipeline_script.py --schedule 1f1b --micro-batches 4 --steps 10

On the host: torchrun --standalone --nproc_per_node=3 examples/pipeline/my_pipeline_script.py.

Every rank also trains the whole model alone, from the same seed on the same batches (it is small),
and checks its stage's parameters against the same layers there: a pipeline computes exactly what one
process does, up to the order of floating-point sums. Each rank prints one line, the last stage's
with the loss:

    PIPELINE rank=2 stages=3 schedule=1f1b micro_batches=4 steps=10 layers=4-5 params_match=True loss=0.9126

It ends with os._exit(0), as examples/trace/my_ddp_script.py does and for the same reason: under a
plain torchrun, a script that returns instead aborts now and then as Python exits, after its work.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
LAYERS, WIDTH, BATCH, LR = 6, 64, 32, 1e-2


def build_model() -> nn.Sequential:
    """The whole model, the same on every rank: LAYERS blocks of Linear and Tanh."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(LAYERS)])


def batches(steps: int) -> list:
    """The (input, target) of every step, the same on every rank from one seed: targets a fixed
    function of the inputs (a random linear map, squashed), which the model can learn."""
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(WIDTH, WIDTH, generator=generator) / WIDTH ** 0.5
    inputs = [torch.randn(BATCH, WIDTH, generator=generator) for _ in range(steps)]
    return [(x, torch.tanh(x @ teacher)) for x in inputs]


def mse(output, target):
    return ((output - target) ** 2).mean()


def reference(data, micro_batches: int) -> nn.Sequential:
    """The whole model trained alone on the same batches: each step's loss the mean of its micro-batches',
    as the schedules take it."""
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in data:
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            (mse(model(xs), ys) / micro_batches).backward()
        optimizer.step()
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, stages = dist.get_rank(), dist.get_world_size()
    share = [LAYERS // stages + (1 if s < LAYERS % stages else 0) for s in range(stages)]
    first = sum(share[:rank])
    mine = nn.Sequential(*list(build_model())[first:first + share[rank]])
    stage = PipelineStage(mine, rank, stages, torch.device("cpu"))
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.micro_batches, loss_fn=mse)
    optimizer = torch.optim.Adam(mine.parameters(), lr=LR)
    data, losses = batches(args.steps), []
    for x, y in data:
        optimizer.zero_grad()
        step_losses = []
        if rank == 0:
            schedule.step(x)
        elif rank == stages - 1:
            schedule.step(target=y, losses=step_losses)
        else:
            schedule.step()
        optimizer.step()
        losses += [torch.stack(step_losses).mean().item()] if step_losses else []
    alone = list(reference(data, args.micro_batches))[first:first + share[rank]]
    match = all(torch.allclose(p, q, atol=1e-5) for p, q in zip(mine.parameters(), nn.Sequential(*alone).parameters()))
    loss = f" loss={losses[-1]:.4f} first_loss={losses[0]:.4f}" if losses else ""
    print(f"PIPELINE rank={rank} stages={stages} schedule={args.schedule} micro_batches={args.micro_batches} "
          f"steps={args.steps} layers={first}-{first + share[rank] - 1} params_match={match}{loss}", flush=True)
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
