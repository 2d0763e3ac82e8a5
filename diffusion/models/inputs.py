"""What a network's forward checks of its inputs before the first layer, shared by the UNet and the MLP: the kind
of batch (vectors or images), one timestep per sample, every input on x's device, the sample's shape and dtype (each
network's own `check_input_shape`, `check_input_dtype`) and labels only where the network takes them. Each is said
naming the argument (`x`, `t`, `y`) with its fix, as InvalidValue, OutOfRange or WrongType, never as torch's error
from deep in a layer. A few comparisons of shapes, dtypes and devices per call: nothing is read from the device
(the labels' values are read only where they are on the CPU: `check_class_labels`)."""

from typing import Literal, Protocol

import torch

from diffusion.core.guidance import NO_LABEL
from diffusion.core.noise import WrongDtype
from diffusion.errors import InvalidValue, OutOfRange, WrongType
from diffusion.models.embedding import check_unconditional


class Network(Protocol):
    in_channels: int
    num_classes: int | None

    def check_input_shape(self, shape: torch.Size) -> None: ...

    def check_input_dtype(self, x: torch.Tensor, name: str = "x") -> None: ...


def check_forward_inputs(
    network: Network,
    x: torch.Tensor,
    t: torch.Tensor,
    y: torch.Tensor | None,
    kind: Literal["vectors", "images"],
) -> None:
    """`network(x, t, y)`'s inputs, checked before its first layer (see the module's docstring)."""
    if not isinstance(x, torch.Tensor):  # a NumPy array has a shape, an ndim and even a device ("cpu")
        raise WrongType(
            "x", x, "a torch.Tensor", "pass x as a tensor: torch.as_tensor(x, dtype=torch.float32)"
        )
    check_batch_rank(type(network), x, kind, network.in_channels)
    check_timesteps(t, len(x))
    check_on_device_of_x(x, t=t, y=y)
    network.check_input_shape(x.shape[1:])
    network.check_input_dtype(x)
    if network.num_classes is None:
        check_unconditional(y, type(network).__name__)
    elif y is not None:
        check_class_labels(y, len(x), network.num_classes)


def check_on_device_of_x(x: torch.Tensor, **inputs: object) -> None:
    """InvalidValue unless each tensor of `inputs` (name -> value; None and non-tensors are others' to check) is on
    x's device: torch would say only `Tensor on device cpu is not on the expected device meta!` from a layer."""
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.device != x.device:
            raise InvalidValue(
                f"{name} is on {value.device} and x on {x.device}",
                f"put them on one device: {name}.to(x.device)",
            )


def check_batch_rank(owner: type, x: torch.Tensor, kind: Literal["vectors", "images"], width: int) -> None:
    """`x` is a batch of `kind` (B, D) or (B, C, H, W), or InvalidValue saying which network takes the other kind
    (a forward's first check; the sample's own shape is `check_input_shape`'s)."""
    forms = {
        "vectors": (2, f"(B, {width})", "(B, D)", "an MLP"),
        "images": (4, f"(B, {width}, H, W)", "(B, C, H, W)", "a UNet"),
    }
    rank, takes, form, _ = forms[kind]
    other = "images" if kind == "vectors" else "vectors"
    if x.ndim != rank:
        raise InvalidValue(
            f"{owner.__name__} takes x of shape {takes}, a batch of {kind}, and got {tuple(x.shape)}",
            f"pass a batch of {kind} {form}; a batch of {other} {forms[other][2]} needs {forms[other][3]}",
            owner,
        )


def check_timesteps(t: object, batch: int) -> None:
    """`t` one timestep per sample of the batch, a (B,) tensor: WrongType for anything else, OutOfRange for a
    length other than B (which broadcast, or ended in torch's size mismatch deep in a layer)."""
    fix = "pass one timestep per sample, e.g. torch.full((len(x),), t)"
    if not isinstance(t, torch.Tensor):
        raise WrongType("t", t, "a tensor of timesteps, shape (B,)", fix)
    if t.shape != (batch,):
        raise OutOfRange("t", f"<shape {tuple(t.shape)}>", f"of shape ({batch},), one per sample of x", fix)


def check_class_labels(y: object, batch: int, num_classes: int) -> None:
    """`y` one class label per sample of the batch, a (B,) integer tensor of classes 0..num_classes-1 or NO_LABEL:
    WrongType or OutOfRange naming `y`, never torch's `IndexError: index out of range in self` from the class
    embedding (on a GPU, a device-side assert). The values are read only on the CPU, where it costs a compare of B
    numbers: on a GPU it would stall every step on a device sync, and the labels a run feeds are checked where they
    enter (a batch's, `labels=` of sampling); nor while torch.compile traces the forward (a graph break)."""
    fix = f"pass one class per sample, 0..{num_classes - 1} (or {NO_LABEL}: no label), as a torch.long tensor"
    if not isinstance(y, torch.Tensor):
        raise WrongType("y", y, "a tensor of class labels, shape (B,)", fix)
    if y.dtype not in (torch.int64, torch.int32):  # what the class embedding takes
        raise WrongDtype("y", y, "int64 class labels", fix)
    if y.shape != (batch,):
        raise OutOfRange(
            "y", f"<shape {tuple(y.shape)}>", f"of shape ({batch},), one label per sample of x", fix
        )
    if y.device.type != "cpu" or torch.compiler.is_compiling() or batch == 0:
        return
    lowest, highest = torch.aminmax(y)  # one pass (about 2 us on a small batch), a third of a masked any()
    if int(lowest) < NO_LABEL or int(highest) >= num_classes:
        shown = sorted(set(y[(y < NO_LABEL) | (y >= num_classes)].tolist()))[:12]
        raise OutOfRange(
            "y", shown, f"classes 0..{num_classes - 1} (or {NO_LABEL}: no label)",
            f"pass labels of this network's {num_classes} classes, as a torch.long tensor",
        )  # fmt: skip
