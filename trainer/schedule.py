"""What each step trains on, in the two modes. The loop in train.py is the same for both.

Global-batch mode (gpt, or toy with --global-batch G): step s trains on the G samples that
(seed, G, s) alone pick, each rank taking its share in K micro-batches (trainer/batching.py).

Epoch mode (toy without --global-batch): each rank walks its DistributedSampler shard, one
--batch-size batch a step. The shard has the same length on every rank and in every epoch, so an
epoch is len(loader) steps and the run --epochs x len(loader): step s is batch (s - 1) % len(loader)
of epoch (s - 1) // len(loader) + 1. At each epoch's end every rank prints its mean loss.

A schedule answers the loop's questions: which batches step s trains on (batch), what to record and
print once it is done (log), anything to do once after step 1 (after_first_step), and the run's
result (final_loss, summary).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, DistributedSampler

from trainer import checkpoint, tensorparallel
from trainer.batching import BatchError, global_batch_indices, parse_rank_micro, plan_micro_batches, rank_share
from trainer.ddp import param_checksum
from trainer.dist import all_gather, all_reduce_sum, print0, println


@dataclass
class Batch:
    """One step's work on this rank."""

    micros: list  # this rank's (x, y) micro-batches, on the CPU; gradients are synchronised on the last
    scale: float  # multiplies the summed loss, so that DDP's average over ranks is the step's mean
    tokens: int  # the step's tokens over all ranks (samples, for toy)
    samples: int  # this rank's samples in the step


def schedule_for(run):
    """gpt always runs in global-batch mode; toy does with --global-batch, else in epochs."""
    if run.args.global_batch or run.args.workload == "gpt":
        return GlobalBatches(run)
    return Epochs(run)


class GlobalBatches:
    """Steps of one global batch each: the same samples at step s whatever the world size."""

    def __init__(self, run):
        args, c, workload = run.args, run.c, run.workload
        self.run = run
        # the data's shares: a rank each, or a node each under tensor parallelism (its processes share one)
        self.share, shares = tensorparallel.data_share(args, c)
        self.counted = tensorparallel.counts_samples(args, c)
        self.global_batch = args.global_batch or args.micro_batch * shares  # pp: flags resolved it
        self.staged = run.pipeline is not None  # pp: every stage walks the whole batch, in M micro-batches
        try:
            self.accum, self.sizes = (
                (args.micro_batches, [self.global_batch // args.micro_batches] * c.world_size) if self.staged
                else plan_micro_batches(self.global_batch, args.micro_batch, shares,
                                        parse_rank_micro(args.rank_micro_batch)))
            global_batch_indices(workload.n_samples, self.global_batch, args.seed, 1)  # too big a batch fails here
        except BatchError as exc:
            raise SystemExit(f"error: {exc}") from None
        self.start = checkpoint.resume(run, self.global_batch) if args.ckpt_every else 1
        self.steps = args.steps
        self.tokens_per_step = self.global_batch * workload.tokens_per_sample
        self.loss = None  # the global loss, on the steps that print it
        self.step1_consistent = None  # unknown when resuming past step 1
        self.micro_samples = self.sizes[self.share]  # this rank's micro-batch (the step model calibrates one)
        print0(f"{run.tag} global batch {self.global_batch} = {self.accum} accumulation steps x micro-batches "
               f"{self.sizes}" + (f" x {workload.tokens_per_sample} tokens" if workload.tokens_per_sample > 1 else ""))

    def batch(self, step):
        args, c, workload = self.run.args, self.run.c, self.run.workload
        indices = global_batch_indices(workload.n_samples, self.global_batch, args.seed, step)
        if self.staged:  # the whole batch, which the schedule cuts; its samples counted once, by the loss's stage
            last = c.rank == c.world_size - 1
            return Batch([workload.batch(indices)], 1.0, self.tokens_per_step, self.global_batch if last else 0)
        micros = [workload.batch(m) for m in rank_share(indices, self.sizes, self.accum, self.share)]
        # Scale so that DDP's average over the shares is the mean over the step's tokens (see batching.py).
        return Batch(micros, len(self.sizes) / self.tokens_per_step, self.tokens_per_step,
                     self.accum * self.sizes[self.share] if self.counted else 0)

    def log(self, step, batch, loss_sum, timing, record):
        """Every step's record carries this rank's loss; the steps that print also the global one."""
        run = self.run
        # pp: only the last stage has a loss; tp: a node's first process counts its node's
        record["rank_loss"] = loss_sum.item() / (batch.samples * run.workload.tokens_per_sample) if batch.samples else None
        if step == self.steps or (run.args.log_every and step % run.args.log_every == 0):
            # The global loss is a collective; only on the steps that print, to keep steps comm-clean.
            self.loss = all_reduce_sum(loss_sum.item() if batch.samples else 0.0, run.c.device) / self.tokens_per_step
            record["loss"] = self.loss
            println(f"{run.tag} step {step}/{self.steps} loss {self.loss:.6f} "
                    f"({timing.step_ms:.0f} ms: compute {timing.compute_ms:.0f}, comm wait {timing.comm_wait_ms:.0f})")
        run.metrics.log(**record)

    def after_first_step(self):
        # The check people are told to do by hand: after the first step every replica is identical.
        if self.staged:
            return  # a pipeline's stages hold different layers; its SUMMARY checks the tied embedding
        self.step1_consistent = len(set(all_gather(param_checksum(self.run.workload.model)))) == 1

    def final_loss(self):
        return self.loss  # the last step always prints, so this is its global loss

    def summary(self):
        return {"global_batch": self.global_batch, "accum_steps": self.accum, "micro_batches": self.sizes,
                "replicas_consistent_after_step1": self.step1_consistent, "resumed_from_step": self.start - 1,
                "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}


class Epochs:
    """Passes over the dataset, each rank over its own shard: toy's default mode."""

    def __init__(self, run):
        args, c = run.args, run.c
        if args.ckpt_every:
            raise SystemExit("error: --ckpt-every needs global-batch mode (--global-batch G, or --workload gpt): "
                             "there a resumed run sees exactly the samples the lost one would have")
        self.run = run
        self.loader, self.sampler = build_loader(run.workload.dataset, args.batch_size, args.seed, c.rank,
                                                 c.world_size, c.device)
        if len(self.loader) == 0:
            raise SystemExit(f"error: --samples {args.samples} over {c.world_size} ranks "
                             "leaves none per rank; raise --samples")
        self.per_epoch = len(self.loader)
        self.micro_samples = args.batch_size  # one micro-batch a step (the step model calibrates one)
        self.start, self.steps = 1, args.epochs * self.per_epoch
        self.epoch_loss = None  # the last finished epoch's mean loss on this rank

    def epoch_of(self, step):
        return (step - 1) // self.per_epoch + 1

    def batch(self, step):
        if (step - 1) % self.per_epoch == 0:  # an epoch begins
            # set_epoch reseeds the shuffle: a new order each epoch, the same on all ranks.
            self.sampler.set_epoch(self.epoch_of(step))
            self.batches = iter(self.loader)
            # Sum on the device: an .item() per step would stall a GPU pipeline.
            self.loss_sum = torch.zeros((), device=self.run.c.device)
            self.samples = 0
        x, y = next(self.batches)
        # drop_last gives every rank the same batch size: DDP's average is the global mean.
        return Batch([(x, y)], 1 / len(y), len(y) * self.run.c.world_size, len(y))

    def log(self, step, batch, loss_sum, timing, record):
        """A step record every --log-every steps; at an epoch's end its record and printed line."""
        run, epoch = self.run, self.epoch_of(step)
        self.loss_sum += loss_sum
        self.samples += batch.samples
        if run.args.log_every and step % run.args.log_every == 0:
            run.metrics.log(**record, epoch=epoch, loss=loss_sum.item() / batch.samples)
        if step % self.per_epoch == 0:  # the epoch's last step
            self.epoch_loss = self.loss_sum.item() / self.samples
            run.metrics.log(kind="epoch", rank=run.c.rank, epoch=epoch, step=step, loss=self.epoch_loss,
                            samples=record["samples"], elapsed_s=record["elapsed_s"])
            println(f"{run.tag} epoch {epoch}/{run.args.epochs} loss {self.epoch_loss:.4f}")

    def after_first_step(self):
        pass  # epoch mode has never compared replicas after step 1; the end of the run does

    def final_loss(self):
        return all_reduce_sum(self.epoch_loss, self.run.c.device) / self.run.c.world_size  # a collective: every rank

    def summary(self):
        return {"epochs": self.run.args.epochs}


def build_loader(dataset, batch_size, seed, rank, world_size, device):
    # The sampler hands each rank a disjoint shard. drop_last=True evens the
    # shards out, so every rank takes the same number of steps; a rank with an
    # extra step would wait forever in DDP's gradient all-reduce.
    # Passing num_replicas/rank explicitly makes it work without a process group.
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    pin_memory = device.type == "cuda"  # faster host-to-GPU copies
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin_memory)
    return loader, sampler
