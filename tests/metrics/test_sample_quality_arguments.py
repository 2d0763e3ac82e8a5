"""SampleQuality scores only what it is told the images are: pixels, uint8 0..255 or (pixel features) float in
[0, 1]. Samples in model units (-1..1, what `generate` returns) or floats 0..255 gave another FID without a word;
metrics=[] computed nothing; a lone name was read letter by letter; 2 channels were taken."""

import inspect
import re

import pytest
import torch

from diffusion import SampleQuality
from diffusion.errors import UserError
from diffusion.metrics.sample_quality import METRIC_OPTIONS


def pixels_quality() -> SampleQuality:
    return SampleQuality("pixels", ["fid"], channels=1)


IMAGES = torch.rand(20, 1, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("images", "words"),
    [
        (
            IMAGES * 2 - 1,
            r"^images holds values from -0.9\d* to 0.9\d*, outside \[0, 1\] .* — pass to_uint8\(",
        ),
        (IMAGES * 255, r"^images holds values from .* to 25\d.*, outside \[0, 1\] .* — pass to_uint8\("),
        (
            torch.full((2, 1, 8, 8), float("nan")),
            r"^images holds NaN values, which are no pixels — pass to_uint8",
        ),
        ((IMAGES * 255).long(), r"^images are torch.int64 values, not uint8 .* images.to\(torch.uint8\)"),
        (IMAGES.expand(-1, 3, -1, -1), r"^images has 3 channels .* built for channels=1 — "),
        (IMAGES[0], r"^images has shape \(1, 8, 8\), not \(N, C, H, W\) — "),
        (IMAGES.tolist(), r"^images=<list> is a list, not \(N, C, H, W\) images as a tensor — "),
    ],
    ids=["model-units", "float-0-255", "nan", "int64", "channels", "one-image", "list"],
)
def test_images_that_are_not_pixels_are_refused_before_they_are_scored(images, words):
    quality = pixels_quality()
    with pytest.raises(UserError, match=words) as refused:
        quality.update(images, real=True)
    assert isinstance(refused.value, ValueError | TypeError)
    assert int(quality.fid.real_features_num_samples) == 0  # nothing was fed


def test_pixels_within_half_a_level_of_the_range_are_scored():
    # A hair beyond [0, 1] (rounding) is still pixels: taken, and scored about as the clamped images.
    fake = torch.rand(20, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    edge = IMAGES.clone()
    edge[0, 0, 0, :2] = torch.tensor([-1e-3, 1 + 1e-3])  # half a level is 2e-3
    scores = []
    for real in (edge, edge.clamp(0, 1)):
        quality = pixels_quality()
        quality.update(real, real=True)
        quality.update(fake, real=False)
        scores.append(quality.compute()["fid"])
    assert scores[0] == pytest.approx(scores[1], rel=1e-3)
    # uint8 pixels are the other form taken (what to_uint8 gives and every caller in the project feeds)
    quality = pixels_quality()
    quality.update(IMAGES.mul(255).round().to(torch.uint8), real=True)
    quality.update(fake.mul(255).round().to(torch.uint8), real=False)
    assert quality.compute()["fid"] == pytest.approx(scores[1], rel=0.05)


def test_real_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^real='no' is a str, not True or False — "):
        pixels_quality().update(IMAGES, real="no")


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        (
            {"metrics": "fid"},
            TypeError,
            r"^metrics='fid' is a str, not a list of metric names — pass metrics=\['fid'\]",
        ),
        ({"metrics": []}, ValueError, r"^metrics=\[\] names no metric — name some of \['fid', 'kid', 'is'\]"),
        ({"channels": 2}, ValueError, r"^channels=2 must be 1 \(gray\) or 3 \(RGB\) — "),
        ({"channels": 0}, ValueError, r"^channels=0 must be 1 \(gray\) or 3 \(RGB\) — "),
        ({"channels": 1.0}, ValueError, r"^channels=1.0 must be a whole number — "),
        ({"channels": "1"}, TypeError, r"^channels='1' is a str, not a whole number — "),
        # a repeated metric was computed once, without a word
        (
            {"metrics": ["fid", "kid", "fid"]},
            ValueError,
            r"^metrics=\['fid', 'kid', 'fid'\] has 'fid' twice — name each metric once: metrics=\['fid', 'kid'\]",
        ),
    ],
    ids=[
        "lone-name",
        "no-metric",
        "two-channels",
        "zero-channels",
        "float-channels",
        "text-channels",
        "repeated-metric",
    ],
)
def test_options_that_would_score_nothing_or_something_else_are_refused(options, error, words):
    with pytest.raises(error, match=words):
        SampleQuality("pixels", **{"metrics": ["fid"], "channels": 1, **options})


def test_kid_subset_size_says_its_requirement_once():
    # "must be >= 2 (KID's unbiased estimator) — pass a value >= 2 (KID's unbiased estimator)" (tester 8b, P6)
    with pytest.raises(ValueError) as refused:
        SampleQuality("pixels", channels=1, kid_subset_size=0)
    message = str(refused.value)
    assert message.startswith("kid_subset_size=0 must be >= 2 (KID's unbiased estimator) — pass e.g. 1000"), (
        message
    )
    assert message.count("unbiased estimator") == 1, message


def test_inception_options_are_checked_before_the_weights_load(monkeypatch):
    # is_splits=0 was found after the Inception weights had loaded (or downloaded); a missing weights file was said
    # as a failed download, "offline, pass a local copy", which the caller had done (tester 8b, P6)
    import diffusion.metrics.sample_quality as sample_quality

    def no_loading(*args, **kwargs):
        raise AssertionError("the feature extractor was built before the options were checked")

    monkeypatch.setattr(sample_quality, "make_feature_extractor", no_loading)
    with pytest.raises(ValueError, match=r"^is_splits=0 must be a whole number >= 1 — pass e.g. 10"):
        SampleQuality("inception", ["is"], is_splits=0)
    with pytest.raises(
        FileNotFoundError, match=r"^inception_weights=/nonexistent.pth does not exist — pass the "
    ):
        SampleQuality("inception", ["is"], inception_weights="/nonexistent.pth")
    with pytest.raises(UserError) as refused:
        SampleQuality("inception", ["is"], inception_weights="/nonexistent.pth")
    assert "downloaded" not in refused.value.problem and "offline" not in refused.value.fix


def test_inception_weights_with_pixel_features_are_warned_unused(tmp_path):
    from diffusion.training.callbacks import SampleQualityCallback

    unused = r"^inception_weights='nope.pth' is not used: features='pixels' computes no Inception features"
    with pytest.warns(UserWarning, match=unused):
        SampleQuality("pixels", ["fid"], channels=1, inception_weights="nope.pth")  # not read, so not checked
    with pytest.warns(UserWarning, match=unused):
        SampleQualityCallback(features="pixels", num_samples=4, inception_weights="nope.pth")


@pytest.mark.parametrize(
    ("metrics", "option", "value", "computed"),
    [(["fid"], "kid_subset_size", 5, "KID"), (["fid"], "kid_subsets", 3, "KID"), (["fid", "kid"], "is_splits", 2,
     "Inception Score")],
)  # fmt: skip
def test_an_option_of_a_metric_not_computed_is_warned_unused(metrics, option, value, computed):
    # kid_subset_size=5 without 'kid' was taken without a word, as if KID were computed (tester 12b, X12)
    said = f"{option}={value} is not used: metrics={metrics!r} computes no {computed} — add "
    unused = "^" + re.escape(said)
    with pytest.warns(UserWarning, match=unused) as warned:
        SampleQuality("pixels", metrics, channels=1, **{option: value})
    assert len(warned) == 1 and warned[0].filename == __file__  # said of the caller's line


def test_an_option_at_its_default_or_of_a_metric_computed_is_not_warned(recwarn):
    SampleQuality("pixels", ["fid"], channels=1, kid_subset_size=1000, kid_subsets=100, is_splits=10)
    SampleQuality("pixels", ["fid", "kid"], channels=1, kid_subset_size=5, kid_subsets=3)
    assert not [w for w in recwarn if "is not used" in str(w.message)]


def test_an_unknown_keyword_is_refused_naming_it_and_the_accepted_ones():
    # torchmetrics said "Unexpected keyword arguments: `bogus`", naming neither SampleQuality nor a fix (tester 9b, R8)
    with pytest.raises(
        TypeError, match=r"^SampleQuality got unexpected keyword arguments \['bogus'\] — pass only"
    ) as refused:
        SampleQuality("pixels", channels=1, bogus=3)
    assert isinstance(refused.value, UserError)
    for name in [*METRIC_OPTIONS, "kid_subsets", "inception_weights"]:
        assert name in str(refused.value)


def test_every_option_said_accepted_is_torchmetrics_and_every_own_argument_is_listed():
    defaults = {
        "compute_on_cpu": False,
        "dist_sync_on_step": False,
        "sync_on_compute": True,
        "compute_with_cache": True,
    }
    for name in METRIC_OPTIONS:  # torchmetrics refuses a name it does not take
        SampleQuality("pixels", ["fid", "kid"], channels=1, **{name: defaults.get(name)})
    own = [name for name in inspect.signature(SampleQuality).parameters if name != "metric_kwargs"]
    with pytest.raises(TypeError) as refused:
        SampleQuality("pixels", channels=1, compute_on_gpu=True)
    assert all(name in str(refused.value) for name in own)


@pytest.mark.parametrize("metric", ["fid", "kid"])
@pytest.mark.parametrize(("real", "generated", "side"), [(20, 0, "generated"), (20, 1, "generated"),
                                                         (1, 20, "real"), (0, 20, "real")])  # fmt: skip
def test_too_few_images_of_a_side_say_the_call_that_feeds_them(metric, real, generated, side):
    """Round 11b's V11: FID's count check named no fix; KID's was torchmetrics' "No samples to concatenate", and
    one image of a side gave a NaN KID without a word."""
    quality = SampleQuality("pixels", [metric], channels=1)
    for count, is_real in ((real, True), (generated, False)):
        if count:
            quality.update(IMAGES[:count], real=is_real)
    with pytest.raises(ValueError) as raised:
        quality.compute()
    got = real if side == "real" else generated
    assert str(raised.value) == (
        f"{metric.upper()} needs at least 2 {side} images, got {got} — feed "
        f"{'the reference images' if side == 'real' else 'the samples'} with update(images, real={side == 'real'}) "
        "before compute(), 2 or more in all"
    )
