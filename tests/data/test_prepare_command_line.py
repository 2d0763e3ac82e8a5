"""prepare's command line: a flag of one of train.py's sections (`--model.lr 5`), which prepare takes only from a
train.py config file to leave it alone, is refused instead of ignored without a word (a config file's sections
stay accepted); an object-storage URL that names no bucket (container, host) is refused, naming it, before the
store is asked (obstore's parse of it blamed the network and the credentials)."""

from pathlib import Path

import pytest
from helpers.user_errors import error_line

from diffusion.cli.prepare import main as prepare
from diffusion.data import ImageDataModule, VectorDataModule
from diffusion.data import prepared as prepared_module
from diffusion.errors import InvalidValue


def refused(capsys, argv: list[str]) -> tuple[str, str]:
    with pytest.raises(SystemExit) as exit_info:
        prepare(argv)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    return error_line(stderr), stderr


@pytest.mark.parametrize(
    ("flags", "given", "section"),
    [
        (["--model.lr", "5"], "--model.lr 5", "model"),
        (["--model.lr", "5", "--print_config"], "--model.lr 5", "model"),
        (["--print_config", "--trainer.max_steps=9"], "--trainer.max_steps 9", "trainer"),
        (["--seed_everything", "3"], "--seed_everything 3", "seed_everything"),
        (["--ema.decay", "0.9", "--data.batch_size", "8"], "--ema.decay 0.9", "ema"),
    ],
)
def test_a_flag_of_train_pys_sections_is_refused_not_ignored(flags, given, section, tmp_path, capsys):
    out = tmp_path / "set"
    line, stderr = refused(capsys, ["--out", str(out), *flags])
    assert line == (
        f"error: {given}: not an option of this command (train.py's {section} section, which prepare reads only "
        "from a train.py --config file, and leaves alone) — drop it here and pass it to train.py; prepare takes "
        "--data.* and its own options (see --help)"
    )
    assert "NestedArg" not in stderr and "Warning" not in stderr
    assert not out.exists()


def test_a_train_py_config_files_sections_stay_accepted_and_left_alone(tmp_path, capsys):
    config = tmp_path / "recipe.yaml"
    config.write_text(
        "model:\n  lr: 5\ntrainer:\n  max_steps: 9\nseed_everything: 3\n"
        "data:\n  class_path: diffusion.data.VectorDataModule\n  init_args:\n    dataset: gaussian\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        prepare(["--config", str(config), "--out", str(tmp_path / "set"), "--print_config"])
    assert exit_info.value.code == 0
    assert "max_steps: 9" in capsys.readouterr().out


STORELESS = [
    ("s3://", "s3://", "bucket"),
    ("s3:///set", "s3://", "bucket"),
    ("gs://", "gs://", "bucket"),
    ("gcs:///set", "gcs://", "bucket"),
    ("az://", "az://", "container"),
    ("abfs:///set", "abfs://", "container"),
    ("http://", "http://", "host"),
    ("https:///set", "https://", "host"),
]


@pytest.fixture
def no_store(monkeypatch):
    """The store is never asked: a request to it fails the test."""

    def asked(*args, **kwargs):
        raise AssertionError(f"the store was asked: {args}")

    monkeypatch.setattr(prepared_module.subprocess, "run", asked)


@pytest.mark.parametrize(("url", "scheme", "store"), STORELESS)
def test_an_out_url_that_names_no_bucket_is_refused_before_the_store_is_asked(
    url, scheme, store, no_store, capsys
):
    line, _ = refused(capsys, ["--out", url])
    assert line == f"error: --out {url}: names no {store} — pass {scheme}{store.upper()}/PATH"


@pytest.mark.parametrize(("url", "scheme", "store"), STORELESS[:3])
def test_a_prepared_set_url_that_names_no_bucket_is_refused_in_python_too(url, scheme, store, no_store):
    with pytest.raises(InvalidValue, match=f"^root {url}: names no {store} — pass {scheme}"):
        ImageDataModule(dataset="streaming", root=url)
    with pytest.raises(InvalidValue, match=f"^path {url}: names no {store}"):
        VectorDataModule(dataset="streaming", path=url)
    with pytest.raises(InvalidValue, match=f"^{url}: names no {store}"):
        prepared_module.listing(url)


def test_a_url_with_a_bucket_is_not_refused(no_store):
    assert prepared_module.store_named("s3://bucket", "{command:--out}") == "s3://bucket"
    assert prepared_module.store_named(str(Path("s3:") / "x")) == str(Path("s3:") / "x")  # a local folder


def test_the_training_loaders_options_given_to_prepare_are_said_unused(tmp_path, capsys):
    """Round 10's S3: `--data.batch_size 5` was range-checked, printed by --print_config, then dropped unsaid;
    round 14a's P6: `--data.num_workers 3` too (prepare's own --num_workers sets its processes)."""
    pytest.importorskip("litdata")
    (tmp_path / "run.yaml").write_text("data:\n  init_args:\n    on_device: false\n")
    given = ["--data.batch_size", "5", "--data.num_workers", "3", "--config", str(tmp_path / "run.yaml")]
    prepare(["--out", str(tmp_path / "set"), *given])
    err = capsys.readouterr().err
    assert (
        "note: --data.batch_size 5 is not used: prepare writes the data set, and the batch size is the training "
        "loader's — pass it to train.py" in err
    )
    assert (
        "note: --data.num_workers 3 is not used: prepare writes the data set, and it sets the training loader's "
        "workers — prepare's own --num_workers sets its processes" in err
    )
    assert (
        f"note: {tmp_path / 'run.yaml'}: data.on_device false is not used: prepare writes the data set" in err
    )
    prepare(["--out", str(tmp_path / "again"), "--num_workers", "1"])  # its own option: no note
    assert "note:" not in capsys.readouterr().err


def test_a_negative_seed_is_refused_as_the_flag(tmp_path, capsys):
    """`--seed -4` was recorded in prepared.json without a word; prepare() refuses it now, said of its argument."""
    with pytest.raises(SystemExit) as stop:
        prepare(["--out", str(tmp_path / "set"), "--seed", "-4"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: --seed -4 is out of range (must be a whole number in [0, 2**64 - 1]) — pass a seed from 0 to "
        "18446744073709551615: the order the samples are stored in"
    )
    assert not (tmp_path / "set").exists()
