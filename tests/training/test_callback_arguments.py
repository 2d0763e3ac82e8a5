"""The training callbacks a user's own `Trainer` takes check their arguments when built, as the public functions do
(tests/test_public_api_arguments.py): a ValueError or TypeError naming the argument, with its fix, before any
training step. A dict where SamplingOptions go failed at fit start with an AttributeError, a seed of -1 at the first
validation, after the steps before it, and every_n_minutes=NaN was taken, its timed checkpoints never written
(tester round 6b: L4, L5)."""

import warnings

import pytest

from diffusion import SamplingOptions
from diffusion.training.callbacks import EMA, Checkpoint, FIDCallback, SampleGrid, SampleQualityCallback
from diffusion.training.callbacks.heartbeat import Heartbeat
from diffusion.training.callbacks.preemption import Preemption

CASES = [
    ("checkpoint-nan-minutes", lambda: Checkpoint(every_n_minutes=float("nan")), ValueError, "every_n_minutes"),
    ("checkpoint-infinite-minutes", lambda: Checkpoint(every_n_minutes=float("inf")), ValueError, "every_n_minutes"),
    ("checkpoint-negative-minutes", lambda: Checkpoint(every_n_minutes=-1), ValueError, "every_n_minutes"),
    ("checkpoint-text-minutes", lambda: Checkpoint(every_n_minutes="30"), TypeError, "every_n_minutes"),
    ("checkpoint-bool-minutes", lambda: Checkpoint(every_n_minutes=True), TypeError, "every_n_minutes"),
    ("checkpoint-text-top-k", lambda: Checkpoint(save_top_k="2"), TypeError, "save_top_k"),
    # Lightning's MisconfigurationException named ModelCheckpoint(save_top_k=3, monitor=None) and no fix
    ("checkpoint-top-k-without-monitor", lambda: Checkpoint(save_top_k=3), ValueError, "monitor"),
    ("checkpoint-fractional-steps", lambda: Checkpoint(every_n_train_steps=2.5), ValueError, "every_n_train_steps"),
    ("grid-dict-as-sampling", lambda: SampleGrid(sampling={"sampler": "ddim", "steps": 2}), TypeError, "sampling"),
    ("grid-name-as-sampling", lambda: SampleGrid(sampling="ddim"), TypeError, "sampling"),
    ("grid-negative-seed", lambda: SampleGrid(seed=-1), ValueError, "seed"),
    ("grid-text-count", lambda: SampleGrid(num_samples="64"), TypeError, "num_samples"),
    ("grid-fractional-every", lambda: SampleGrid(every_n_validations=1.5), ValueError, "every_n_validations"),
    ("quality-dict-as-sampling", lambda: SampleQualityCallback(sampling={"steps": 2}), TypeError, "sampling"),
    ("quality-text-count", lambda: SampleQualityCallback(num_samples="100"), TypeError, "num_samples"),
    ("quality-text-kid", lambda: SampleQualityCallback(kid="no"), TypeError, "kid"),
    # num_real 0 was read as unset: num_samples real images, without a word (tester round 10b: T4)
    ("quality-zero-real", lambda: SampleQualityCallback(features="pixels", num_real=0), ValueError, "num_real=0"),
    ("fid-zero-real", lambda: FIDCallback(features="pixels", num_real=0), ValueError, "num_real=0"),
    ("quality-fractional-real", lambda: SampleQualityCallback(features="pixels", num_real=2.5), ValueError,
     "num_real=2.5"),
    # a fractional snapshot interval was stored as given (T3)
    ("ema-fractional-snapshots", lambda: EMA(post_hoc=True, snapshot_every=2.5), ValueError, "snapshot_every=2.5"),
    # a str failed in arithmetic (TypeError naming nothing); 0, -5 and NaN were taken (S5)
    ("heartbeat-text-timeout", lambda: Heartbeat(timeout_s="60"), TypeError, "timeout_s"),
    ("heartbeat-zero-timeout", lambda: Heartbeat(timeout_s=0), ValueError, "timeout_s=0"),
    ("heartbeat-negative-timeout", lambda: Heartbeat(timeout_s=-5), ValueError, "timeout_s=-5"),
    ("heartbeat-nan-timeout", lambda: Heartbeat(timeout_s=float("nan")), ValueError, "timeout_s=nan"),
    ("heartbeat-infinite-timeout", lambda: Heartbeat(timeout_s=float("inf")), ValueError, "timeout_s=inf"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "argument"), [case[1:] for case in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_callback_argument_is_refused_by_its_name_when_built(call, error, argument):
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert argument in message.split("—")[0], message
    assert "—" in message, f"no fix: {message}"


def test_good_callback_arguments_are_taken():
    assert Preemption(every_n_minutes=None).every_n_minutes is None  # None: no timed checkpoints
    assert Checkpoint(every_n_minutes=0.5).preemption.every_n_minutes == 0.5
    assert Checkpoint(save_top_k=3, monitor="val/loss").save_top_k == 3
    options = SamplingOptions(sampler="ddim", steps=2)
    assert SampleGrid(sampling=options, seed=2**64 - 1).sampling is options
    assert SampleGrid(sampling=None).sampling == SamplingOptions()  # None: the model's own defaults
    assert SampleQualityCallback(sampling=options, features="pixels").sampling is options
    # None: as many as num_samples
    assert SampleQualityCallback(num_samples=50, features="pixels").num_real == 50
    assert SampleQualityCallback(num_samples=50, features="pixels", num_real=2).num_real == 2


def test_every_n_validations_says_what_the_callback_does():
    # SampleQualityCallback said "pass 1 for a grid at every validation": it draws no grid (tester 8b, P6)
    with pytest.raises(ValueError, match=r"— pass 1 to score samples \(FID, KID\) at every validation$"):
        SampleQualityCallback(features="pixels", num_samples=100, every_n_validations=2.5)
    with pytest.raises(ValueError, match=r"— pass 1 for a grid at every validation$"):
        SampleGrid(every_n_validations=0)


def test_a_missing_inception_weights_file_is_refused_when_built(tmp_path):
    # found at setup before, after the run had started
    with pytest.raises(FileNotFoundError, match=r"^inception_weights=.*nope.pth does not exist — "):
        SampleQualityCallback(inception_weights=str(tmp_path / "nope.pth"))
    SampleQualityCallback(
        features="pixels", inception_weights=str(tmp_path / "nope.pth")
    )  # pixels read no file


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"kid": False}, "(kid=False)"),
        ({"reference_stats": "digits.npz"}, "(reference_stats holds no real images'"),
    ],
)
def test_a_kid_subset_size_with_no_kid_is_said_not_used(options, why):
    # It was passed on to SampleQuality with metrics=['fid'] at setup, which warned in words the caller never wrote.
    with pytest.warns(UserWarning, match=r"^kid_subset_size=8 not used: no KID is computed ") as caught:
        SampleQualityCallback(features="pixels", kid_subset_size=8, **options)
    assert why in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        SampleQualityCallback(features="pixels", kid_subset_size=8)  # KID computed: used
        SampleQualityCallback(features="pixels", kid=False)  # left at its default
