"""The command line as users type it: configs, shorthands, run folders, resume and bad input.

Multi-process launches (`train.py --devices 2`, torchrun, two nodes) are in cli/test_launchers.py.
"""

import gc
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY_MLP, TINY_UNET, tiny_run
from PIL import Image

from diffusion.cli.train import DiffusionCLI, main
from diffusion.cli.trainer_options import TRAINER_OPTION_RANGES, expand_shorthands
from diffusion.errors import UserError
from diffusion.training.run_folders import latest_checkpoint

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def test_shorthands_expand_to_trainer_flags():
    args = [
        "--devices",
        "4",
        "--strategy=ddp",
        "--model.lr",
        "1e-3",
        "--max_steps",
        "10",
        "--config",
        "x.yaml",
    ]
    assert expand_shorthands(args) == [
        "--trainer.devices", "4", "--trainer.strategy=ddp", "--model.lr", "1e-3", "--trainer.max_steps", "10",
        "--config", "x.yaml",
    ]  # fmt: skip


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_parses_and_builds(config, tmp_path):
    # The download folder of the torchvision sets, the folder's images; the bundled digits read none
    extra = [] if config.stem.startswith("digits") else ["--data.init_args.root", str(tmp_path)]
    if config.stem == "folder":
        Image.new("RGB", (40, 30), "red").save(tmp_path / "a.png")
        extra += ["--data.init_args.image_size", "32"]
    if config.stem == "toy2d":
        extra = []
    cli = DiffusionCLI(["--config", str(config), *extra, "--trainer.logger", "false"])
    assert cli.model.sample_shape == cli.datamodule.sample_shape
    assert cli.config.trainer.max_steps > 0


def test_cifar10_recipe_is_the_paper_network():
    cli = DiffusionCLI(["--config", str(CONFIGS[0].parent / "cifar10.yaml"), "--trainer.logger", "false"])
    n_params = sum(p.numel() for p in cli.model.network.parameters())
    assert abs(n_params - 35.7e6) / 35.7e6 < 0.01
    assert cli.model.hparams.lr == 2e-4 and cli.model.hparams.warmup_steps == 5000
    assert cli.datamodule.sample_shape == (3, 32, 32)
    assert cli.config.trainer.precision == "16-mixed" and cli.config.data.init_args.batch_size == 128


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """The values a YAML file sets, by dotted key: {"trainer.max_steps": 3500, ...}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def printed_config(command, args: list[str], capsys) -> dict[str, object]:
    with pytest.raises(SystemExit) as exit_info:
        command([*args, "--print_config"])
    assert exit_info.value.code == 0
    return leaves(yaml.safe_load(capsys.readouterr().out))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_recipes_hold_only_what_differs_from_the_code_defaults(config, capsys):
    recipe = leaves(yaml.safe_load(config.read_text()))
    classes = [
        arg for key, value in recipe.items() if key.endswith(".class_path") for arg in (f"--{key}", value)
    ]
    defaults = printed_config(DiffusionCLI, classes, capsys)  # the code defaults of the recipe's classes
    # Class paths may repeat a default class: they say whose init_args follow.
    repeated = {k: v for k, v in recipe.items() if not k.endswith(".class_path") and defaults.get(k) == v}
    assert repeated == {}, f"{config.name} repeats code defaults"


def test_every_checked_trainer_option_is_an_option_of_the_command(capsys):
    options = printed_config(DiffusionCLI, [], capsys)
    assert {key for key, _, _ in TRAINER_OPTION_RANGES} <= options.keys()


def test_no_arguments_train_the_default_recipe_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    recipe = leaves(yaml.safe_load((CONFIGS[0].parent / "digits.yaml").read_text()))
    config = printed_config(main, [], capsys)  # what `python train.py` runs
    assert {key: config[key] for key in recipe} == recipe
    # The recipe holds overrides only: each of its values differs from the code default (defined once).
    defaults = printed_config(DiffusionCLI, [], capsys)
    assert [key for key, value in recipe.items() if defaults[key] == value] == []


def test_default_run_leaves_checkpoint_logs_and_grid_in_one_folder(digits_checkpoint):
    run = digits_checkpoint.parents[1]  # the session's tiny run of the default recipe (conftest.py)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    assert (run / "samples" / "latest.png").is_file() and (run / "config.yaml").is_file()
    assert Image.open(run / "samples" / "latest.png").size[0] > 16


def test_resume_with_ckpt_path_last_continues_the_same_run(tmp_path):
    tiny_run(tmp_path)
    cli = tiny_run(tmp_path, "--ckpt_path", "last", "--max_steps", "6")
    assert cli.trainer.global_step == 6  # continued from step 4, not restarted
    assert Path(cli.trainer.log_dir).name == "version_0"
    assert not (tmp_path / "digits" / "version_1").exists()


def test_ckpt_path_last_without_a_run_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="train first"):
        latest_checkpoint(tmp_path, "digits")


def test_fast_dev_run_on_vector_data_and_a_users_npy_file(tmp_path):
    points = np.random.default_rng(0).normal(size=(300, 5)).astype(np.float32)
    np.save(tmp_path / "points.npy", points)
    config = str(CONFIGS[0].parent / "toy2d.yaml")
    cli = main(["--config", config, *TINY_MLP, "--data.path", str(tmp_path / "points.npy"),
                "--trainer.fast_dev_run", "true", "--trainer.logger", "false"])  # fmt: skip
    assert cli.model.sample_shape == (5,) and cli.model.network(
        torch.zeros(2, 5), torch.zeros(2).long()
    ).shape == (2, 5)
    assert cli.trainer.global_step == 1


def test_fast_dev_run_on_a_folder_of_images(tmp_path):
    images = tmp_path / "my_images"
    images.mkdir()
    for i in range(6):
        Image.fromarray(np.full((20, 24, 3), i * 40, np.uint8)).save(images / f"{i}.png")
    config = str(CONFIGS[0].parent / "folder.yaml")
    cli = main(["--config", config, *TINY_UNET, "--data.root", str(images), "--data.image_size", "16",
                "--trainer.fast_dev_run", "true", "--trainer.logger", "false"])  # fmt: skip
    assert cli.model.sample_shape == (3, 16, 16) and cli.trainer.global_step == 1


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--model.beta_schedule", "quadratic", "beta_schedule"),
        ("--model.prediction_type", "score", "prediction_type"),
        ("--data.dataset", "imagenet", "dataset"),
    ],
)
def test_bad_options_are_rejected_naming_the_option(flag, value, message, capsys):
    with pytest.raises(SystemExit):
        DiffusionCLI([flag, value, "--trainer.logger", "false"])
    assert message in capsys.readouterr().err


def test_mixed_precision_on_cpu_warns_that_it_is_slow():
    with pytest.warns(UserWarning, match="precision=16-mixed on CPU"):
        DiffusionCLI(["--accelerator", "cpu", "--precision", "16-mixed", "--trainer.logger", "false"])


@pytest.mark.parametrize("flags", [["--strategy", "ddp"], ["--strategy", "ddp", "--devices", "1"],
                                   ["--strategy", "ddp_find_unused_parameters_true", "--devices", "1"]])  # fmt: skip
def test_ddp_on_one_device_trains_without_the_wrapper(flags, caplog):
    # One process pays nothing for DDP: its bucket copies and the graph breaks it puts in a compiled network.
    cli = DiffusionCLI([*TINY_UNET, *flags, "--accelerator", "cpu", "--trainer.logger", "false"])
    assert type(cli.trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert "training without the DDP wrapper" in caplog.text


def test_ddp_on_several_devices_or_as_a_class_stays_ddp():
    two = DiffusionCLI([*TINY_UNET, "--strategy", "ddp", "--devices", "2", "--accelerator", "cpu",
                        "--trainer.logger", "false"])  # fmt: skip
    assert type(two.trainer.strategy).__name__ == "DDPStrategy"
    # The class form is how DDP itself (NCCL, gloo) is tested on one device.
    one = DiffusionCLI([*TINY_UNET, "--trainer.strategy.class_path", "DDPStrategy",
                        "--devices", "1", "--accelerator", "cpu", "--trainer.logger", "false"])  # fmt: skip
    assert type(one.trainer.strategy).__name__ == "DDPStrategy"


def test_the_cli_of_this_process_reads_its_own_command_line_from_the_shared_parser(capsys):
    # One parser a process (DiffusionCLI.setup_parser): each CLI parses and links its own command line with it.
    fixed = DiffusionCLI([*TINY_UNET, "--trainer.logger", "false"])
    learned = DiffusionCLI([*TINY_UNET, "--model.variance", "learned_range", "--trainer.logger", "false"])
    again = DiffusionCLI([*TINY_UNET, "--trainer.logger", "false"])
    assert fixed.parser is learned.parser is again.parser
    # The output channels follow each CLI's variance (a link reads the config of the CLI that parses).
    assert [cli.model.network.conv_out.out_channels for cli in (fixed, learned, again)] == [1, 2, 1]
    # A command line that asked for --print_config and then failed leaves no request behind.
    with pytest.raises(SystemExit):
        DiffusionCLI(["--print_config", "--model.lr", "nope", "--trainer.logger", "false"])
    capsys.readouterr()
    assert DiffusionCLI([*TINY_UNET, "--trainer.logger", "false"]).model.network.conv_out.out_channels == 1
    assert capsys.readouterr().out == ""


def test_a_cli_let_go_of_frees_its_model(tmp_path, monkeypatch):
    # A notebook's run, done: its model and data go with the CLI, though the process keeps the parser for the next
    # (jsonargparse leaves it in a context variable too) and the fit ran the parser's links and instantiators.
    cli = tiny_run(tmp_path, "--model.variance", "learned_range")
    model, data = weakref.ref(cli.model), weakref.ref(cli.datamodule)
    del cli
    gc.collect()
    assert model() is None and data() is None
    # A CLI refused after its classes were built (--ddp_timeout is checked then): its model goes too.
    built = []
    checks = DiffusionCLI.after_instantiate_classes
    monkeypatch.setattr(
        DiffusionCLI,
        "after_instantiate_classes",
        lambda cli: built.append(weakref.ref(cli.model)) or checks(cli),
    )
    with pytest.raises(UserError, match="ddp_timeout"):
        DiffusionCLI([*TINY_UNET, "--ddp_timeout", "0", "--trainer.logger", "false"])
    gc.collect()
    assert len(built) == 1 and built[0]() is None


def test_a_process_keeps_a_few_parsers(monkeypatch):
    # One per kind (parser arguments, Trainer defaults, ...), the oldest going past 4: defaults whose repr differs
    # at each call would otherwise keep a parser a call.
    monkeypatch.setattr(DiffusionCLI, "_built_parsers", {})

    def stop(cli, parser, args):
        raise StopIteration

    monkeypatch.setattr(DiffusionCLI, "parse_arguments", stop)
    for kind in range(6):
        with pytest.raises(StopIteration):
            DiffusionCLI([], parser_kwargs={"prog": f"train{kind}"})
    assert [parser.prog for parser, _ in DiffusionCLI._built_parsers.values()] == [
        f"train{k}" for k in range(2, 6)
    ]


def test_init_from_beside_a_resume_is_refused_unless_the_run_started_from_it(tmp_path, capsys):
    # The resume took the checkpoint's weights, and --model.init_from was read and dropped without a word.
    tiny_run(tmp_path)
    checkpoint = tmp_path / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        tiny_run(tmp_path, "--model.init_from", str(checkpoint), "--ckpt_path", "last", "--max_steps", "6")
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        f"error: --model.init_from {checkpoint} with --ckpt_path {checkpoint}: a resume goes on "
    )
    assert "leave out --model.init_from to resume the run, or leave out --ckpt_path" in line
    # A run started from those weights names them in its config.yaml: its restarts (--ckpt_path auto, the same
    # command line) and its resumes with that config go on, without reading them: the checkpoint's weights win, and
    # the first weights may have been moved away since (tester round 24b: S5, "no checkpoint at first.ckpt").
    first = shutil.copy(checkpoint, tmp_path / "first.ckpt")
    started = tiny_run(tmp_path / "b", "--model.init_from", str(first))
    config = Path(started.trainer.log_dir) / "config.yaml"
    Path(first).unlink()
    cli = main(["--config", str(config), "--ckpt_path", "last", "--max_steps", "6"])
    assert cli.trainer.global_step == 6
    assert yaml.safe_load(config.read_text())["model"]["init_from"] == str(first)  # still the run's record


def test_fast_dev_run_writes_no_files(tmp_path, monkeypatch, caplog):
    # Lightning says "Logging and checkpointing is suppressed", and the project's callbacks wrote
    # checkpoints/last.ckpt, loss.png and samples/ into the current folder (the run has no folder then).
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    args = [*TINY_UNET, "--trainer.fast_dev_run", "true", "--ema.post_hoc", "true"]
    cli = main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    assert cli.trainer.global_step == 1
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == []
    assert "fast_dev_run: a smoke test that writes no files" in caplog.text


def test_help_offers_no_optimizer_flags_of_lightningcli(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "--model.lr_schedule" in shown and "--optimizer" not in shown and "--lr_scheduler" not in shown
