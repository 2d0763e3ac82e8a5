"""The constructors of the public API (NoiseSchedule, the data modules, IndexedDataset, Batch, StepTimer,
DiffusionModule, MLP) check their arguments as the commands check their flags, as the functions do
(tests/test_public_api_arguments.py): a bad value is refused with a ValueError or a TypeError naming the argument
and its fix, when the object is made, not at its first use."""

import pytest
import torch
from helpers import assert_refused_by_name, tiny_vector_model

from diffusion import (
    MLP,
    Batch,
    DiffusionModule,
    ImageDataModule,
    IndexedDataset,
    NoiseSchedule,
    UNet,
    VectorDataModule,
)
from diffusion.training.callbacks import StepTimer

UNCONDITIONAL, CONDITIONAL = tiny_vector_model(None, steps=3), tiny_vector_model(3, steps=3)
X_T = torch.zeros(3, 2)

# (id, the call, the exception type, the argument its message names)
CASES = [
    # the constructors' counts: torch's own words (linspace) or a comparison of a str with an int
    ("schedule-fractional-steps", lambda: NoiseSchedule(num_timesteps=10.5), ValueError, "num_timesteps"),
    # a beta_start past the default beta_end was blamed on beta_end, whose fix was the value already there
    ("schedule-start-past-end", lambda: NoiseSchedule(beta_start=0.03), ValueError, "beta_start=0.03 must be in (0, "),
    ("schedule-zero-trained-beta", lambda: NoiseSchedule("trained", 2, trained_betas=[0.0, 0.1]), ValueError,
     "trained_betas"),
    ("images-text-size", lambda: ImageDataModule(image_size="8"), TypeError, "image_size"),
    # "" is the current folder to pathlib: read as the data's folder without a word
    ("images-empty-root", lambda: ImageDataModule(root=""), ValueError, "root"),
    ("vectors-empty-path", lambda: VectorDataModule("npy", path=" "), ValueError, "path"),
    ("vectors-bool-batch", lambda: VectorDataModule(batch_size=True), TypeError, "batch_size"),
    # the data modules' bools took any value: 'no' turned conditional training on, blamed later on with_labels
    ("images-text-conditional", lambda: ImageDataModule(conditional="no"), TypeError, "conditional='no'"),
    ("images-text-flip", lambda: ImageDataModule(random_flip="no"), TypeError, "random_flip='no'"),
    ("images-text-verify", lambda: ImageDataModule(verify="no"), TypeError, "verify='no'"),
    ("images-text-on-device", lambda: ImageDataModule(on_device="no"), TypeError, "on_device='no'"),
    ("vectors-text-on-device", lambda: VectorDataModule(on_device="false"), TypeError, "on_device='false'"),
    # NaN noise gave an all-NaN set without a word; a fraction failed in sklearn's words (round 10b: T1, T2)
    ("vectors-nan-noise", lambda: VectorDataModule("moons", noise=float("nan")), ValueError, "noise=nan"),
    ("vectors-fractional-count", lambda: VectorDataModule(num_samples=2.5), ValueError, "num_samples=2.5"),
    # were bare UserErrors, which `except ValueError` let through
    ("vectors-streaming-without-path", lambda: VectorDataModule("streaming"), ValueError, "dataset streaming"),
    ("vectors-streaming-labels", lambda: VectorDataModule("streaming", path="set", labels="l.npy"), ValueError,
     "labels"),
    # StepTimer stored a fractional count as given, and timed a rounded number of steps
    ("step-timer-fractional-steps", lambda: StepTimer(steps=2.5), ValueError, "steps=2.5 must be a whole number"),
    ("step-timer-fractional-warmup", lambda: StepTimer(warmup_steps=0.5), ValueError, "warmup_steps=0.5 must be a"),
    ("step-timer-fractional-profile", lambda: StepTimer(profile_steps=1.5), ValueError, "profile_steps=1.5 must be"),
    # IndexedDataset: items of one element said "got tuple"; truthy text turned labels on
    ("indexed-unlabelled-items", lambda: IndexedDataset(torch.utils.data.TensorDataset(X_T), with_labels=True)[0],
     TypeError, "with_labels"),
    ("indexed-fractional-label", lambda: IndexedDataset([(X_T[0], 1.5)], with_labels=True)[0], TypeError,
     "with_labels"),
    ("indexed-text-as-bool", lambda: IndexedDataset([X_T[0]], with_labels="yes"), TypeError, "with_labels"),
    # no dataset was taken, and failed at the first len() in torch's words
    ("indexed-none", lambda: IndexedDataset(None), TypeError, "base"),
    ("indexed-number-as-transform", lambda: IndexedDataset([X_T[0]], transform=3), TypeError, "transform"),
    # Batch: built from anything, found (if at all) inside training
    ("batch-list-as-x", lambda: Batch([1, 2], torch.arange(2)), TypeError, "x"),
    ("batch-short-index", lambda: Batch(torch.rand(4, 2), torch.arange(3)), ValueError, "index"),
    ("batch-text-label", lambda: Batch(torch.rand(4, 2), torch.arange(4), "cat"), TypeError, "label"),
    # DiffusionModule itself: a network's name where the network goes failed at the first sample
    ("module-name-as-network", lambda: DiffusionModule("UNet", sample_shape=(2,)), TypeError, "network"),
    # the class itself, not built (sampling_module.check_is_network)
    ("module-class-as-network", lambda: DiffusionModule(UNet, sample_shape=(1, 8, 8)), TypeError, "network"),
    # a module of another kind failed at the first step: "forward() takes 2 positional arguments but 3 were given"
    ("module-linear-as-network", lambda: DiffusionModule(torch.nn.Linear(2, 2), sample_shape=(2,)), TypeError,
     "network"),
    # its sample shape failed at the first sample in torch's words; class names of no class were kept silently
    ("module-negative-size", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(1, -8, 8)), ValueError,
     "sample_shape[1]"),
    ("module-text-size", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=("2",)), TypeError,
     "sample_shape[0]"),
    ("module-size-as-shape", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=2), TypeError,
     "sample_shape"),
    # a shape the network cannot take was refused at the first sample, blamed on "the data" (round 10b: T8)
    ("module-images-for-an-mlp", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(1, 8, 8)), ValueError,
     "sample_shape=(1, 8, 8)"),
    ("module-names-unconditional", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,),
                                                           class_names=["a", "b"]), ValueError, "class_names"),
    ("module-names-miscounted", lambda: DiffusionModule(CONDITIONAL.network, sample_shape=(2,),
                                                        class_names=["a", "b"]), ValueError, "class_names"),
    # truthy text or a bool where a bool or a number goes: "no" rescaled the schedule, lr=True trained at 1.0
    ("schedule-text-as-bool", lambda: NoiseSchedule(zero_terminal_snr="no"), TypeError, "zero_terminal_snr"),
    ("module-bool-as-lr", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,), lr=True), TypeError,
     "lr"),
    # a noise seed out of [0, 2**64) was taken modulo 2**64: another seed's training noise, without a word
    ("module-negative-noise-seed", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,), noise_seed=-1),
     ValueError, "noise_seed"),
    ("module-huge-noise-seed", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,),
                                                       noise_seed=2**70 + 5), ValueError, "noise_seed"),
    # a normalization that fits no sample was kept, and refused only when rendering, by a line blaming the render
    ("module-normalization-miscounted", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,),
     normalization={"shift": [0.0], "scale": [1.0, 1.0]}), ValueError, "normalization"),
    ("module-normalization-zero-scale", lambda: DiffusionModule(UNCONDITIONAL.network, sample_shape=(2,),
     normalization={"shift": [0.0, 0.0], "scale": [0.0, 1.0]}), ValueError, "normalization['scale'][0]"),
    # linear betas that would reach 1 were clipped at 0.999; sizes no memory holds ended in torch's allocation error
    ("schedule-huge", lambda: NoiseSchedule(num_timesteps=2**40), ValueError, "num_timesteps"),
    ("mlp-huge", lambda: MLP(hidden_dim=2**40), ValueError, "hidden_dim"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "argument"), [case[1:] for case in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_argument_of_a_constructor_is_refused_by_its_name(call, error, argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a data set that was not refused would be written here, not in the repo
    assert_refused_by_name(call, error, argument, tmp_path)


@pytest.mark.parametrize("given", [UNet, "UNet"], ids=["class", "name"])
def test_a_network_not_built_is_told_to_build_it(given):
    # sampling_module.check_is_network: the forward check after it would say "its forward takes nothing"
    with pytest.raises(
        TypeError, match=r"is a (type|str), not a network \(a torch.nn.Module\) — pass one built"
    ):
        DiffusionModule(given, sample_shape=(1, 8, 8))
