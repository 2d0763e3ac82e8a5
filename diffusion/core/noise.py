"""Counter-based noise: normals and timesteps as a stateless function of (seed, counters, sample index,
element index), computed with torch integer ops for a whole batch at once, on the device that needs it.

Per-sample reproducibility (a sample's noise must not depend on the batch it is in, the rank that draws it
or the device) without one torch.Generator per sample and a Python loop over the samples at every step: a batch is a few elementwise kernels, and the random bits are the same on every device and for
every split of the samples into batches or ranks; the normals, made from them by Box-Muller, agree across
devices to the rounding of log, sqrt and cos (a few float32 ulps).

The bits: Chris Wellons' lowbias32 integer hash (hash-prospector), applied to the sample index and the element
index under a 64-bit key derived from (seed, counters). Both multipliers are below 2**31, so every product of
a 32-bit value fits in int64 exactly: no overflow on any backend, and the result equals the uint32 reference.
"""

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from diffusion.errors import InvalidValue, OutOfRange, UserError, WrongType

MASK32 = 0xFFFFFFFF
_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)  # lowbias32's, both < 2**31
_KEY_INITS = (0x243F6A88, 0x85A308D3)  # digits of pi: two independent 32-bit halves of the key

# Streams keep the draws of different purposes apart even when their seeds and counters coincide.
TRAINING_NOISE, TRAINING_TIMESTEPS, SAMPLING_NOISE = 0, 1, 2
LABEL_DROPOUT = 3  # per-sample label dropout: independent of the same sample's noise and timestep
LIKELIHOOD_NOISE = 4  # the noise of the bound's x_t
AUGMENTATION = 5  # the training data's random flips: a function of (data seed, epoch, dataset index)
OFFSET_NOISE = 6  # offset noise's per-(sample, channel) normal: apart from the same sample's pixel noise

IntOrTensor = TypeVar("IntOrTensor", int, torch.Tensor)


def mix32(x: IntOrTensor) -> IntOrTensor:
    """lowbias32: a bijection of [0, 2**32) with good avalanche, for Python ints or int64 tensors."""
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIERS[0]) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MULTIPLIERS[1]) & MASK32
    return x ^ (x >> 15)


def noise_key(seed: int, *counters: int) -> tuple[int, int]:
    """A 64-bit key (two 32-bit halves) from a seed and any counters (stream, step, draw number), each
    taken modulo 2**64."""
    words = [part for value in (seed, *counters) for part in (value & MASK32, (value >> 32) & MASK32)]
    halves = []
    for h in _KEY_INITS:
        for word in words:
            h = mix32(h ^ word)
        halves.append(h)
    return halves[0], halves[1]


def random_bits(key: tuple[int, int], indices: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count) int64 in [0, 2**32): bits e of sample indices[b], a function of (key, index, e) only."""
    row_key, col_key = key
    indices = indices.long()
    row = mix32(mix32((indices & MASK32) ^ row_key) ^ ((indices >> 32) & MASK32))  # (B,)
    col = mix32(torch.arange(count, device=indices.device) ^ col_key)  # (count,)
    # The element's own hash (not e itself) meets the row's, so two samples do not share shifted blocks.
    return mix32(mix32((row[:, None] + col[None, :]) & MASK32))  # (B, count)


def normal(
    shape: Sequence[int], key: tuple[int, int], indices: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Standard normals of `shape` (B, ...) on the device of `indices` (B,), by Box-Muller on pairs of
    24-bit uniforms: elements 2p and 2p + 1 of a sample are the cosine and sine of pair p."""
    if len(indices) != shape[0]:
        raise ValueError(f"got {len(indices)} sample indices for a batch of {shape[0]} samples")
    batch, size = shape[0], math.prod(shape[1:])
    pairs = (size + 1) // 2
    bits = random_bits(key, indices, 2 * pairs).view(batch, pairs, 2)
    u1 = ((bits[..., 0] >> 8).float() + 0.5) * 2.0**-24  # (0, 1): log(u1) is finite
    u2 = (bits[..., 1] >> 8).float() * 2.0**-24  # [0, 1)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = (2.0 * math.pi) * u2
    z = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)  # (B, pairs, 2)
    return z.view(batch, 2 * pairs)[:, :size].reshape(tuple(shape)).to(dtype)


def randint(high: int, key: tuple[int, int], indices: torch.Tensor) -> torch.Tensor:
    """One integer in [0, high) per sample, (B,) int64 on the device of `indices`."""
    if not 1 <= high < 2**31:
        raise OutOfRange("high", high, "in [1, 2**31)")
    bits = random_bits(key, indices, 1)[:, 0]
    return (bits * high) >> 32  # Lemire's multiply-shift: exact in int64 since high < 2**31


class PerSampleNoise:
    """Noise for a batch of samples named by their indices: draw k of sample i depends only on
    (seed, step, k, i), so N samples split over any batches, ranks or devices get the same noise.

    Pass it where the samplers take a `generator` (`randn` below draws from it); each call of `randn` is the
    next draw, as successive torch.randn calls on one generator per sample would be.
    """

    def __init__(self, seed: int, indices: torch.Tensor, step: int = 0, stream: int = SAMPLING_NOISE) -> None:
        self.seed, self.step, self.stream = seed, step, stream
        self.indices = torch.as_tensor(indices).long()
        self.draws = 0
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def randn(self, shape: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
        device = torch.device(device) if device is not None else self.indices.device
        if device not in self._on_device:  # one copy per device, not one per step
            self._on_device[device] = self.indices.to(device)
        key = noise_key(self.seed, self.stream, self.step, self.draws)
        self.draws += 1
        return normal(shape, key, self._on_device[device])


Generators = torch.Generator | PerSampleNoise | Sequence[torch.Generator] | None
"""Where the samplers draw noise: the global RNG (None), one generator, per-sample noise, or a generator per sample."""


def randn(shape: Sequence[int], generator: Generators, device: torch.device) -> torch.Tensor:
    """Standard normal noise of `shape` (B, ...) on `device`, drawn from the given generator(s)."""
    if isinstance(generator, PerSampleNoise):
        return generator.randn(shape, device)  # the whole batch at once, on the device
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        return torch.randn(tuple(shape), generator=generator, device=gen_device).to(device)
    if len(generator) != shape[0]:
        raise ValueError(
            f"got {len(generator)} generators for a batch of {shape[0]} samples; pass one per sample"
        )
    return torch.stack([torch.randn(tuple(shape[1:]), generator=g, device=g.device) for g in generator]).to(
        device
    )


class WrongDtype(WrongType):
    """A tensor of the wrong element type where floats go (`x_T` of int64, samples of bool): `<name> is a <dtype>
    tensor, not <expected> — <fix>` (WrongType's own form would print the tensor's values as its kind)."""

    def __init__(self, name: str, tensor: torch.Tensor, expected: str, fix: str) -> None:
        dtype = str(tensor.dtype).removeprefix("torch.")
        article = "an" if dtype[0] in "aeio" else "a"  # "a uint8" (said you-int), "an int64"
        UserError.__init__(self, f"{name} is {article} {dtype} tensor, not {expected}", fix)
        self.name, self.value, self.expected = name, tensor, expected


CONVERSIONS = {
    torch.float32: "float()",
    torch.float64: "double()",
    torch.float16: "half()",
    torch.bfloat16: "bfloat16()",
}


def check_network_dtype(name: str, x: torch.Tensor, weights: torch.dtype, network: str) -> None:
    """`x` of the dtype of the network's `weights`, or under autocast (which casts the operands of the matmuls and
    convolutions, though never float64's): a float64 batch (torch.from_numpy's) or a float16 one of a float32
    network failed in torch's words, "mat1 and mat2 must have the same dtype". One dtype compare where they
    match, so it costs a training step nothing."""
    if x.dtype == weights or (x.dtype != torch.float64 and torch.is_autocast_enabled(x.device.type)):
        return
    theirs = str(weights).removeprefix("torch.")
    made = " (torch.from_numpy makes float64)" if x.dtype == torch.float64 else ""
    fix = f"pass {name}.{CONVERSIONS.get(weights, f'to({weights})')}{made}"
    if x.is_floating_point():  # an integer batch is no network's dtype
        fix += f", or convert the network with network.{CONVERSIONS.get(x.dtype, f'to({x.dtype})')}"
    raise WrongDtype(name, x, f"{theirs}, the dtype of the {network}'s weights", fix)


def check_initial_noise(
    x_T: Any, network: Any = None, sample_shape: str = "sample_shape", count: str = ""
) -> None:
    """x_T, the initial noise of `reverse_steps` and `module.trajectory`, before the first step: a tensor (a count
    of samples ended in "object of type 'int' has no len()", a NumPy array in a false claim of devices), floating
    point (integer noise ended in torch's dtype error at the network's first layer), finite (NaN noise gave NaN
    samples without a word), and float64 only for a `network` of float64 (its `check_input_dtype`, this project's
    networks': said of x_T, not of the network's x). The fix names `sample_shape` as the caller knows it, and for
    an int the call `count` that draws that many samples ("module.sample({n})"), where there is one."""
    fix = f"pass the initial noise, e.g. torch.randn(n, *{sample_shape})"
    if not isinstance(x_T, torch.Tensor):
        if isinstance(x_T, int) and not isinstance(x_T, bool) and x_T >= 1:  # a count of samples
            fix = fix.replace("(n,", f"({x_T},") + (f", or {count.format(n=x_T)} for samples" * bool(count))
        elif hasattr(x_T, "__array__"):  # a NumPy array
            fix += ", or torch.as_tensor(x_T, dtype=torch.float32) for an array"
        raise WrongType("x_T", x_T, "a tensor", fix)
    if not x_T.is_floating_point():
        raise WrongDtype("x_T", x_T, "a floating-point tensor", fix)
    if not x_T.is_meta and not bool(torch.isfinite(x_T).all()):
        raise InvalidValue(
            "x_T holds values that are not finite (NaN or infinity), and every sample drawn from it would be NaN",
            fix,
        )
    check_input_dtype = getattr(network, "check_input_dtype", None)
    if x_T.dtype == torch.float64 and callable(check_input_dtype):  # float64: refused under autocast too
        check_input_dtype(x_T, "x_T")


def check_generator(generator: Any, batch: int) -> None:
    """Where the noise is drawn from: None (the global RNG), a torch.Generator, PerSampleNoise, or one
    torch.Generator per sample of x_T. A str was counted by its length as generators, so refused by kind."""
    fix = "pass a torch.Generator (torch.Generator().manual_seed(0)), one per sample of x_T, or None"
    if generator is None or isinstance(generator, torch.Generator | PerSampleNoise):
        return
    if not isinstance(generator, list | tuple) or not all(isinstance(g, torch.Generator) for g in generator):
        raise WrongType("generator", generator, "a torch.Generator, a list of them or None", fix)
    if len(generator) != batch:
        raise OutOfRange(
            "generator", f"<{len(generator)} generators>", f"one generator per sample of x_T ({batch})",
            "pass as many generators as x_T has samples, or one torch.Generator for all",
        )  # fmt: skip
