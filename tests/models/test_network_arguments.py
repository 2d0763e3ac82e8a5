"""The networks refuse a constructor argument that is not the number it must be, and data of a shape they do not
take, with the project's user errors of their own options (`owner`): never torch's TypeError from inside a layer,
nor a rounded count."""

import numpy as np
import pytest
import torch

import diffusion.errors
from diffusion.errors import InvalidValue, OutOfRange, WrongType
from diffusion.models import MLP, UNet

TINY = {"channels": 8, "channel_mult": (1, 2), "num_res_blocks": 1, "attention_levels": (1,)}

BAD_ARGUMENTS = [  # (network, arguments, error type, the line's start)
    (UNet, {"channels": 8.0}, OutOfRange, r"channels=8.0 must be a whole number — pass channels as an int"),
    (UNet, {"channels": "8"}, WrongType, r"channels='8' is a str, not a whole number"),
    (UNet, {"channels": True}, WrongType, r"channels=True is a bool, not a whole number"),
    # the time embedding is `channels` wide (a sine and a cosine): said of channels, not of an inner `dim`
    (
        UNet,
        {**TINY, "channels": 1, "channel_mult": (1,), "attention_levels": ()},
        OutOfRange,
        r"^channels=1 must be >= 2 — pass a value >= 2$",
    ),
    (
        UNet,
        {**TINY, "channel_mult": (1, "2")},
        WrongType,
        r"channel_mult\[1\]='2' is a str, not a whole number",
    ),
    (
        UNet,
        {**TINY, "channel_mult": (1, 2.5)},
        OutOfRange,
        r"channel_mult=\[1, 2.5\] must be a non-empty list",
    ),
    (UNet, {**TINY, "channel_mult": 2}, WrongType, r"channel_mult=2 is an int, not a sequence of ints"),
    (UNet, {**TINY, "num_res_blocks": 1.5}, OutOfRange, r"num_res_blocks=1.5 must be a whole number"),
    (UNet, {**TINY, "num_heads": "2"}, WrongType, r"num_heads='2' is a str, not a whole number"),
    (UNet, {**TINY, "in_channels": 3.0}, OutOfRange, r"in_channels=3.0 must be a whole number"),
    (UNet, {**TINY, "out_channels": 2.0}, OutOfRange, r"out_channels=2.0 must be a whole number"),
    (UNet, {**TINY, "num_classes": 2.5}, OutOfRange, r"num_classes=2.5 must be a whole number"),
    (UNet, {**TINY, "num_classes": 0}, OutOfRange, r"num_classes=0 must be >= 1 \(or None"),
    (UNet, {**TINY, "dropout": "0.1"}, WrongType, r"dropout='0.1' is a str, not a number in \[0, 1\)"),
    (
        UNet,
        {**TINY, "attention_levels": (1.5,)},
        OutOfRange,
        r"attention_levels=\[1.5\] must be whole numbers in 0",
    ),
    (UNet, {**TINY, "checkpoint_levels": ("0",)}, WrongType, r"checkpoint_levels\[0\]='0' is a str"),
    # a repeated level was taken as once, without a word
    (
        UNet,
        {**TINY, "attention_levels": (1, 1)},
        InvalidValue,
        r"attention_levels \[1, 1\] has level 1 twice — name each level once, e\.g\. attention_levels \[1\]",
    ),
    (
        UNet,
        {**TINY, "checkpoint_levels": (0, 1, 0)},
        InvalidValue,
        r"checkpoint_levels \[0, 1, 0\] has level 0 twice",
    ),
    (MLP, {"hidden_dim": 8.0}, OutOfRange, r"hidden_dim=8.0 must be a whole number"),
    (MLP, {"in_channels": "2"}, WrongType, r"in_channels='2' is a str, not a whole number"),
    (MLP, {"num_blocks": 2.5}, OutOfRange, r"num_blocks=2.5 must be a whole number"),
    (MLP, {"time_embed_dim": 64.0}, OutOfRange, r"time_embed_dim=64.0 must be a whole number"),
    (MLP, {"fourier_frequencies": 2.5}, OutOfRange, r"fourier_frequencies=2.5 must be a whole number"),
    (MLP, {"out_channels": "2"}, WrongType, r"out_channels='2' is a str"),
    (MLP, {"num_classes": 1.5}, OutOfRange, r"num_classes=1.5 must be a whole number"),
    (MLP, {"dropout": None}, WrongType, r"dropout=None is a NoneType, not a number in \[0, 1\)"),
]


@pytest.mark.parametrize(
    ("network", "arguments", "error", "expected"),
    BAD_ARGUMENTS,
    ids=[
        f"{network.__name__}-{list(arguments)[-1]}-{list(arguments.values())[-1]}"
        for network, arguments, *_ in BAD_ARGUMENTS
    ],
)
def test_a_network_refuses_an_argument_that_is_not_its_number_by_its_name(
    network, arguments, error, expected
):
    with pytest.raises(error, match=f"^{expected}") as raised:
        network(**arguments)
    assert raised.value.owner is network  # train.py says it of the flag the user wrote


def test_a_numpy_integer_is_taken_as_the_int_it_is():
    network = UNet(**{**TINY, "channels": np.int64(8), "channel_mult": np.array([1, 2])})
    assert type(network.channels) is int and network.num_levels == 2
    assert MLP(in_channels=np.int32(3), hidden_dim=np.int64(16)).in_channels == 3


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((2,), r"^UNet is for images of shape \(1, H, W\), and the data's samples have shape \(2,\) \(vectors\) — "
               r"train vectors with an MLP \(network diffusion\.models\.MLP\)$"),
        ((3, 8, 8), r"^UNet is for images of 1 channel, and the data's samples have 3 \(shape \(3, 8, 8\)\) — build "
                    r"it with in_channels 3"),
        ((1, 8), r"^UNet is for images of shape \(1, H, W\), and the data's samples have shape \(1, 8\) — "),
    ],
)  # fmt: skip
def test_the_unet_refuses_samples_that_are_not_its_images_saying_which_network_fits(shape, expected):
    network = UNet(**TINY)
    with pytest.raises(InvalidValue, match=expected) as raised:
        network.check_input_shape(shape)
    assert raised.value.owner is UNet
    network.check_input_shape((1, 8, 8))  # its own images pass


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((1, 8, 8), r"^MLP is for vectors of shape \(2,\), and the data's samples have shape \(1, 8, 8\) \(images\) "
                    r"— train images with a UNet \(network diffusion\.models\.UNet\)$"),
        ((3,), r"^MLP is for vectors of 2 features, and the data's samples have 3 — build it with in_channels 3"),
        ((2, 2), r"^MLP is for vectors of shape \(2,\), and the data's samples have shape \(2, 2\) — "),
    ],
)  # fmt: skip
def test_the_mlp_refuses_samples_that_are_not_its_vectors_saying_which_network_fits(shape, expected):
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1)
    with pytest.raises(InvalidValue, match=expected) as raised:
        network.check_input_shape(shape)
    assert raised.value.owner is MLP
    network.check_input_shape((2,))  # its own vectors pass


@pytest.mark.parametrize(
    ("network", "x", "expected"),
    [
        ("unet", (4, 2), r"^UNet takes x of shape \(B, 1, H, W\), a batch of images, and got "),
        ("mlp", (4, 1, 8, 8), r"^MLP takes x of shape \(B, 2\), a batch of vectors, and got \(4, 1, 8"),
        ("mlp", (4, 3), r"^MLP is for vectors of 2 features, and the data's samples have 3"),
        ("unet", (4, 3, 8, 8), r"^UNet is for images of 1 channel, and the data's samples have 3"),
    ],
)
def test_a_forward_of_the_other_kind_of_data_is_refused_as_a_user_error(network, x, expected):
    networks = {"unet": lambda: UNet(**TINY), "mlp": lambda: MLP(in_channels=2, hidden_dim=16, num_blocks=1)}
    with pytest.raises(InvalidValue, match=expected):
        networks[network]()(torch.zeros(x), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("network", ["unet", "mlp"])
@pytest.mark.parametrize("x", [np.zeros, lambda shape: np.zeros(shape).tolist()], ids=["ndarray", "list"])
def test_a_forward_of_x_that_is_no_tensor_names_x_kind(network, x):
    # A NumPy array has a shape and, in NumPy 2, a device ("cpu"): it was said as "t is on cpu and x on cpu"
    networks = {"unet": lambda: (UNet(**TINY), (2, 1, 8, 8)), "mlp": lambda: (MLP(in_channels=2), (2, 2))}
    built, shape = networks[network]()
    with pytest.raises(WrongType) as refused:
        built(x(shape), torch.zeros(2, dtype=torch.long))
    kind = "ndarray" if x is np.zeros else "list"
    assert str(refused.value).endswith(
        f"is a {kind}, not a torch.Tensor — pass x as a tensor: torch.as_tensor(x, dtype=torch.float32)"
    )


def test_an_mlp_no_memory_holds_is_refused_before_allocating(monkeypatch):
    # torch's "can't allocate memory ... 562949953421312 bytes" before, from inside nn.Linear
    with pytest.raises(
        OutOfRange, match=r"^hidden_dim=1099511627776 must be small enough for this machine's"
    ) as error:
        MLP(hidden_dim=2**40)
    assert error.value.owner is MLP
    monkeypatch.setattr(diffusion.errors, "machine_memory", lambda: 4 * 900_000)
    MLP()  # 892,162 float32 weights: 3.6 MB
    with pytest.raises(OutOfRange, match=r"its [\d,]+ weights would take"):
        MLP(num_blocks=5)


def test_a_unet_no_memory_holds_is_refused_before_allocating(monkeypatch):
    # torch's "Storage size calculation overflowed" (2**40) or "can't allocate memory" (2**16) before
    with pytest.raises(
        OutOfRange, match=r"^channels=1099511627776 must be small enough .* at least [\d,]+ weights"
    ):
        UNet(channels=2**40)
    monkeypatch.setattr(diffusion.errors, "machine_memory", lambda: 10**6)
    UNet(**TINY)  # 64,193 weights: 0.26 MB
    with pytest.raises(OutOfRange, match=r"^channels=64 must be small enough") as error:
        UNet(**{**TINY, "channels": 64})
    assert error.value.owner is UNet


class _XT(torch.nn.Module):
    def forward(self, x, t):  # an unconditional network of the user's: the contract's call without labels
        return x


class _Anything(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return args[0]


class _NoForward(torch.nn.Module):
    pass


@pytest.mark.parametrize(
    ("network", "takes"),
    [(UNet, None), (MLP, None), (_XT, None), (_Anything, None), (torch.nn.Linear, "(input)"),
     (torch.nn.Sequential, "(input)"), (_NoForward, "nothing (it defines no forward)")],
)  # fmt: skip
def test_a_network_keeps_the_call_forward_x_t_or_is_said_by_what_its_forward_takes(network, takes):
    """train.py refuses a torch.nn.Module of another kind (`check_network_class`): torch.nn.Linear trained into
    forward's TypeError at the first step. Any network of the contract's call passes, labels or not."""
    from diffusion.models.checks import forward_parameters

    assert forward_parameters(network) == takes


def test_class_labels_off_the_cpu_are_not_read_at_every_forward():
    # The networks refuse a label out of range on the CPU (tester 12b, X7: torch's "index out of range in self");
    # on a GPU reading them would stall every step on a device sync. A meta tensor has no values: reading fails.
    meta = {"device": "meta", "dtype": torch.long}
    network = MLP(in_channels=2, num_classes=3).to("meta")
    assert network(
        torch.zeros(3, 2, device="meta"), torch.zeros(3, **meta), torch.full((3,), 7, **meta)
    ).shape == (3, 2)
    with pytest.raises(OutOfRange, match=r"^y=\[7\] must be classes 0..2 \(or -1: no label\) — "):
        MLP(in_channels=2, num_classes=3)(
            torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), torch.tensor([7, 0, -1])
        )
