"""`python -m diffusion.evaluate`'s notes of an option the user gave that does nothing in the combination given:
one `note: ...` line on stderr, naming the option as written and why it is not used; none when it was not given.
And a figure that would read wrong without a note (a KID below 0)."""

import numpy as np
import pytest

from diffusion.cli import evaluate
from diffusion.cli.evaluate_quality import result_lines


@pytest.fixture
def images(tmp_path):
    """16 samples and 24 reference images, 8x8 grey: pixel features, no download."""
    rng = np.random.default_rng(0)
    for name, count in (("samples", 16), ("reference", 24)):
        np.savez(tmp_path / f"{name}.npz", rng.integers(0, 256, (count, 8, 8, 1), dtype=np.uint8))
    return tmp_path


def kid_args(folder):
    return ["--samples", str(folder / "samples.npz"), "--reference", str(folder / "reference.npz"),
            "--features", "pixels", "--metrics", "kid"]  # fmt: skip


def test_a_kid_subset_size_given_beyond_the_images_is_said_capped(images, capsys):
    evaluate.main([*kid_args(images), "--kid_subset_size", "500"])
    err = capsys.readouterr().err
    assert (
        "note: --kid_subset_size 500 is more than the 16 images of the samples: KID uses subsets of 16" in err
    )
    evaluate.main([*kid_args(images), "--kid_subset_size", "8"])  # within the counts: used as given
    evaluate.main(kid_args(images))  # the default's capping is --help's word
    assert "note:" not in capsys.readouterr().err


def test_a_kid_subset_size_of_a_config_file_is_said_by_its_key(images, capsys):
    (images / "run.yaml").write_text("kid_subset_size: 20\n")
    evaluate.main([*kid_args(images), "--config", str(images / "run.yaml")])
    err = capsys.readouterr().err
    assert (
        "run.yaml: kid_subset_size 20 is more than the 16 images of the samples: KID uses subsets of 16"
        in err
    )


def test_metrics_with_save_stats_alone_are_said_unused(images, capsys):
    args = ["--reference", str(images / "reference.npz"), "--features", "pixels"]
    evaluate.main([*args, "--save_stats", str(images / "a.npz"), "--metrics", "kid"])
    captured = capsys.readouterr()
    assert "wrote the FID statistics of" in captured.out
    assert (
        "note: --metrics kid is not used: without --samples nothing is scored, and --save_stats writes FID "
        "statistics (mu, sigma), which serve FID alone (KID and IS need images: pass --samples to score them)"
        in captured.err
    )
    evaluate.main([*args, "--save_stats", str(images / "b.npz")])
    assert "note:" not in capsys.readouterr().err


def test_paths_under_home_are_read_there(images, tmp_path, monkeypatch, capsys):
    """`save_stats: ~/s.npz` in a config file wrote into a folder literally named ~ (J8, as sample's --out did)."""
    monkeypatch.setenv("HOME", str(images))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(
        "samples: ~/samples.npz\nreference: ~/reference.npz\nsave_stats: ~/s.npz\n"
    )
    evaluate.main(["--config", "run.yaml", "--features", "pixels", "--metrics", "fid"])
    assert (images / "s.npz").is_file() and not (tmp_path / "~").exists()


def fid_args(folder, reference="digits", features="pixels"):
    """The 16 samples against `reference` (the bundled 8x8 digits by default), pixel FD alone."""
    return ["--samples", str(folder / "samples.npz"), "--reference", reference, "--features", features,
            "--metrics", "fid"]  # fmt: skip


@pytest.mark.parametrize(
    ("given", "note"),
    [
        (
            ["--inception_weights", "/nonexistent.pth"],  # not read, so not checked either
            "note: --inception_weights /nonexistent.pth is not used: --features pixels computes no Inception "
            "features (the file is not read)",
        ),
        (
            ["--overwrite"],
            "note: --overwrite is not used: it replaces an existing --save_stats file, and no --save_stats is "
            "given",
        ),
        (
            ["--data_root", "nope"],
            "note: --data_root nope is not used: it is the folder a dataset --reference (mnist, fashion_mnist, "
            "cifar10, folder, streaming) is downloaded to or read from, and --reference digits is bundled "
            "(scikit-learn's 8x8 digits)",
        ),
        (
            ["--kid_subset_size", "4"],
            "note: --kid_subset_size 4 is not used: no KID is computed (see --metrics)",
        ),
    ],
    ids=["inception_weights", "overwrite", "data_root", "kid_subset_size"],
)
def test_an_option_that_does_nothing_here_is_said_unused(images, capsys, recwarn, given, note):
    values = evaluate.main([*fid_args(images), *given])
    err = capsys.readouterr().err
    assert note in err and err.count("is not used") == 1
    # said once, as the flag: not again by the library in Python's words (SampleQuality's own note)
    assert not [w for w in recwarn if "is not used" in str(w.message)], [str(w.message) for w in recwarn]
    assert values == evaluate.main(fid_args(images))  # the same figure as without it
    assert "is not used" not in capsys.readouterr().err


def test_options_a_file_reference_does_not_use_are_said_unused(images, capsys):
    reference = str(images / "reference.npz")
    evaluate.main([*fid_args(images, reference), "--image_size", "16", "--data_root", "nope"])
    err = capsys.readouterr().err
    assert (
        f"note: --image_size 16 is not used: it is the size a dataset --reference is rendered at, and --reference "
        f"{reference} is a file, not a dataset (its images are used as they are)" in err
    )
    assert "note: --data_root nope is not used: it is the folder a dataset --reference" in err


def test_options_set_by_a_config_file_are_said_by_its_key(images, capsys):
    (images / "run.yaml").write_text("overwrite: true\ninception_weights: w.pth\n")
    evaluate.main([*fid_args(images), "--config", str(images / "run.yaml")])
    err = capsys.readouterr().err
    assert "run.yaml: overwrite true is not used: it replaces an existing --save_stats file" in err
    assert "run.yaml: inception_weights w.pth is not used: --features pixels" in err


def test_an_image_size_of_pixel_features_is_said_pooled_to_8x8(images, capsys):
    """Digits rendered at 16 and area-averaged back to 8x8 are the originals: the figure is the default's, and
    the user asked for 16 without a word saying so (M2)."""
    values = evaluate.main([*fid_args(images), "--image_size", "16"])
    assert (
        "note: --image_size 16 renders the reference at 16x16, and pixel features area-average every image to "
        "8x8: the 8x8 samples and the reference are compared at 8x8 whatever the reference's size"
        in capsys.readouterr().err
    )
    assert values == evaluate.main(fid_args(images))
    evaluate.main([*fid_args(images), "--image_size", "8"])  # the samples' size: what it does without it
    assert "note:" not in capsys.readouterr().err


def test_an_image_size_that_inception_would_compare_with_other_samples_is_refused(images, capsys):
    """Refused before the reference is read or any Inception model built (no download, no torch-fidelity)."""
    args = [*fid_args(images, features="inception"), "--image_size", "16"]
    with pytest.raises(SystemExit) as stop:
        evaluate.main(args)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: --image_size 16 renders the reference at 16x16, and the samples are 8x8 — Inception features "
        "compare images of one size: leave --image_size out (a dataset reference is rendered at the samples' "
        "size), or pass --features pixels, which pools both to 8x8"
    )


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["--metrics", "fid", "kid", "fid"], "--metrics [fid, kid, fid]"),
        (["--config", "run.yaml"], "metrics [fid, fid]"),
    ],
)
def test_a_metric_named_twice_is_refused(images, capsys, monkeypatch, given, line):
    """It was computed once, the repeat dropped without a word (SampleQuality refuses it in Python)."""
    monkeypatch.chdir(images)
    (images / "run.yaml").write_text("metrics: [fid, fid]\n")
    with pytest.raises(SystemExit) as stop:
        evaluate.main([*kid_args(images)[:-2], *given])
    assert stop.value.code == 2
    once = "fid kid" if "kid" in given else "fid"
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"{line} names a metric more than once — name each metric once: --metrics {once}")
    )


def test_a_kid_below_zero_is_said_to_be_the_noise_of_its_estimate():
    # Round 23a (noted): 4 images gave "KID: -0.001234 ± ..." without a word
    below = result_lines({"kid_mean": -0.001234, "kid_std": 0.002}, {}, "pixels")
    assert below == [
        "KID: -0.001234 ± 0.002000",
        "note: KID is below 0: its unbiased estimate of a distance smaller than its noise at these image counts — "
        "read it as about 0, within its ± std, or compare more images",
    ]
    assert result_lines({"kid_mean": 0.0, "kid_std": 0.002}, {}, "pixels") == ["KID: 0.000000 ± 0.002000"]
