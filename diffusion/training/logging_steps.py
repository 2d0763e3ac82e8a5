"""The steps at which training pays for collectives and device reads: the logging steps.

On a GPU the host runs ahead of the device, queueing kernels. Reading a device value on the host (`.item()`,
`.tolist()`, `float()`, `bool()`, `.cpu()`) or a blocking collective makes the host wait until the queue has
drained, and the device then idles while the host queues the next work: a cost paid per occurrence, whatever
is read. Between logging steps a training step does neither; the training loss (here) and the preemption poll
(`diffusion.training.callbacks.preemption`) are paid for at the steps Lightning writes step metrics to its
loggers, every `--trainer.log_every_n_steps` optimizer steps.

Logging each step's loss the usual way, `self.log(..., prog_bar=True, sync_dist=True)`, pays every step: under
DDP a barrier and a blocking all-reduce (Lightning's sync), and on any device a read, as Lightning converts the
progress-bar metrics to numbers after every batch, whether a bar is shown or not.
"""

import lightning as L
import torch
import torch.distributed as dist


def is_logging_step(trainer: L.Trainer, step: int) -> bool:
    """Whether optimizer step `step` (1 for the first) is one after which Lightning writes step metrics to its
    loggers: every `log_every_n_steps` steps, and when the run is stopping."""
    every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's logger connector
    return every > 0 and (step % every == 0 or trainer.should_stop)


class IntervalLoss:
    """The training loss averaged over a logging interval, summed on the device in between.

    `add` each micro-batch's loss (a device op, nothing read). Before each optimizer step,
    `mean_at_logging_step` returns None, except before the step that ends a logging interval: then the mean
    over the interval's micro-batches and over the ranks, on the host, from one all-reduce (under DDP) and one
    read.
    """

    def __init__(self) -> None:
        self._total: torch.Tensor | None = None
        self._count = 0

    def reset(self) -> None:
        """A new interval (a fit starts or resumes)."""
        self._total, self._count = None, 0

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        self._total = loss if self._total is None else self._total + loss
        self._count += 1

    def mean_at_logging_step(self, trainer: L.Trainer) -> torch.Tensor | None:
        """The interval's mean loss over micro-batches and ranks as a host tensor, when the optimizer step about
        to be taken ends a logging interval (asked before every step: a collective under DDP); else None."""
        if not is_logging_step(trainer, trainer.global_step + 1) or self._total is None:
            return None
        mean = self._total / self._count
        self.reset()
        if trainer.world_size > 1:
            # A sum, then divided (gloo has no average): Lightning's own reduce would add a barrier.
            dist.all_reduce(mean)
            mean = mean / trainer.world_size
        return mean.cpu()  # the interval's one read
