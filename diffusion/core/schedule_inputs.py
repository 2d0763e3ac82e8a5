"""What `NoiseSchedule`'s methods check of their arguments at entry: the timesteps `t` (a (B,) tensor of an integer
dtype, one per sample of x, on x's device, within the schedule), the tensors that go with x (`noise`, `eps`, the
network `output`: x's shape and device) and the schedule itself on x's device. Each is said naming the argument, as
OutOfRange, InvalidValue or WrongType, never as torch's IndexError or size mismatch from deep in the formula, and a
negative t is refused rather than counted from the end.

Shapes, dtypes and devices are metadata: comparing them costs a few attribute reads per call. t's range is its
values: reading them waits for a GPU. So the range is read only when the caller asks (`check_range`, the public
default); the training step and the samplers, which build t themselves, pass `check_range=False`, and a graph that
torch.compile traces never reads it (it would break the graph)."""

from typing import Protocol

import torch

from diffusion.errors import InvalidValue, OutOfRange, WrongType

INDEX_DTYPES = (torch.int64, torch.int32)  # what torch indexes with (uint8 and bool index as masks)
ONE_PER_SAMPLE = "pass one timestep per sample, e.g. torch.full((len(x),), t)"


class Schedule(Protocol):
    num_timesteps: int
    betas: torch.Tensor


def check_inputs(
    schedule: Schedule, t: object, x_name: str, x: object, check_range: bool, **like_x: object
) -> torch.Tensor:
    """A `NoiseSchedule` method's arguments at entry: x a batch on the schedule's device, t one timestep per sample
    of it (its range read unless `check_range` is False), and `like_x` tensors of x's shape; x returned."""
    x = check_batch(x_name, x)
    check_schedule_device(schedule.betas, x.device)
    check_timesteps("t", t, schedule.num_timesteps, len(x), x.device, check_range)
    for name, value in like_x.items():
        check_like(name, value, x_name, x)
    return x


def shown(t: torch.Tensor) -> str:
    """t's values for a message: the list when short, else its count and range."""
    if t.numel() <= 8:
        return str(t.tolist())
    return f"<{t.numel()} timesteps from {int(t.min())} to {int(t.max())}>"


def check_timesteps(
    name: str,
    t: object,
    num_timesteps: int,
    batch: int | None,
    device: torch.device,
    check_range: bool,
    lowest: int = 0,
) -> torch.Tensor:
    """`t` as the schedule indexes with it: a 1-D tensor of an integer dtype, of length `batch` (None: any), on
    `device`, and (with `check_range`) every value in lowest..num_timesteps - 1."""
    if isinstance(t, int) and not isinstance(t, bool) and batch is not None:
        # one timestep for every sample, as indexing with it always took it (the range below still checked)
        t = torch.tensor(t, device=device)
    if not isinstance(t, torch.Tensor):
        raise WrongType(name, t, "a tensor of timesteps, shape (B,)", ONE_PER_SAMPLE)
    last = num_timesteps - 1
    if t.dtype not in INDEX_DTYPES:
        raise OutOfRange(
            name, f"<{str(t.dtype).removeprefix('torch.')} tensor>", "of an integer dtype (int64 or int32)",
            f"pass whole timesteps in {lowest}..{last}, e.g. torch.randint(0, {num_timesteps}, (len(x),))",
        )  # fmt: skip
    # One per sample: (B,), or as indexing always took them, (B, 1) or one for all (a 0-d tensor)
    one_each = t.ndim == 1 or (t.ndim == 2 and t.shape[1] == 1 and batch is not None)
    if (t.ndim != 0 or batch is None) and (not one_each or (batch is not None and len(t) != batch)):
        requirement = "of shape (B,)" if batch is None else f"of shape ({batch},), one per sample of x"
        raise OutOfRange(name, f"<shape {tuple(t.shape)}>", requirement, ONE_PER_SAMPLE)
    if t.device != device:
        if batch is None:  # no x: the schedule's own device
            problem, fix = (
                f"{name} is on {t.device} and the schedule on {device}",
                f"schedule.to({name}.device)",
            )
        else:
            problem, fix = f"{name} is on {t.device} and x on {device}", f"{name}.to(x.device)"
        raise InvalidValue(problem, f"put them on one device: {fix}")
    if check_range and t.numel() > 0 and not torch.compiler.is_compiling():
        low, high = (int(value) for value in torch.aminmax(t))
        if low < lowest or high > last:
            if lowest == -1:
                note = " (-1: x_0 itself)"
            else:
                note = "; a negative t does not count from the end" if low < 0 else ""
            raise OutOfRange(
                name, shown(t), f"in {lowest}..{last}, the schedule's num_timesteps={num_timesteps}{note}",
                f"pass timesteps {lowest} <= {name} < {num_timesteps}",
            )  # fmt: skip
    return t


def check_batch(name: str, x: object) -> torch.Tensor:
    """`x`, a tensor with a batch dimension."""
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        raise WrongType(
            name, x, "a batch tensor (B, ...)", f"pass {name} as a tensor whose first dimension is the batch"
        )
    return x


def check_like(name: str, value: object, x_name: str, x: torch.Tensor) -> None:
    """`value` a tensor of x's shape on x's device (noise, eps, a network output: what the formula adds to x)."""
    if not isinstance(value, torch.Tensor):
        raise WrongType(
            name, value, f"a tensor of {x_name}'s shape", f"pass {name} as a tensor of {x_name}'s shape"
        )
    if value.shape != x.shape:
        raise OutOfRange(
            name, f"<shape {tuple(value.shape)}>", f"of {x_name}'s shape {tuple(x.shape)}",
            f"pass {name} of the same shape as {x_name}",
        )  # fmt: skip
    if value.device != x.device:
        raise InvalidValue(
            f"{name} is on {value.device} and x on {x.device}", f"put them on one device: {name}.to(x.device)"
        )


def check_schedule_device(buffer: torch.Tensor, device: torch.device) -> None:
    """The schedule's buffers on the device of the tensors it is given (torch would say only that indices and
    values are on different devices)."""
    if buffer.device != device:
        raise InvalidValue(
            f"schedule is on {buffer.device} and x on {device}",
            "put them on one device: schedule.to(x.device)",
        )


def check_step_back(t: torch.Tensor, t_prev: torch.Tensor, check_range: bool) -> None:
    """Each t_prev before its t (a posterior step goes back in time): t_prev >= t gave a negative variance."""
    if check_range and not torch.compiler.is_compiling() and bool((t_prev >= t).any()):
        raise OutOfRange(
            "t_prev", shown(t_prev), f"< t={shown(t)} for every sample, a step back in time (-1: to x_0)",
            "pass t_prev < t, e.g. t - 1 (the default)",
        )  # fmt: skip
