"""`python -m diffusion.evaluate`'s notes of an option the user gave that does nothing in the combination given:
one `note: ...` line on stderr, naming the option as written and why it is not used; none when it was not given."""

import numpy as np
import pytest

from diffusion.cli import evaluate


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
    (tmp_path / "run.yaml").write_text("samples: ~/samples.npz\nreference: ~/reference.npz\nsave_stats: ~/s.npz\n")
    evaluate.main(["--config", "run.yaml", "--features", "pixels", "--metrics", "fid"])
    assert (images / "s.npz").is_file() and not (tmp_path / "~").exists()
