"""The very same flag written twice on one command line with different values (round 19's P2, `--max_steps 2
--max_steps 3` trained 3 steps without a word): the last wins, as in every argparse command and as a script's flags
overridden by the user's rely on, and a note says so; a list flag written twice is refused, its first items lost
where they were likely meant to add up (diffusion/cli/written_twice.py). The same value twice loses nothing;
config files layer (`--config a --config b`); a list added to (`--sweep+=`, `--trainer.callbacks+=`) takes every
value."""

import pytest
import yaml
from helpers.parse_errors import a_parser, refused, train_line

from diffusion.cli.evaluate import main as evaluate
from diffusion.cli.export import main as export
from diffusion.cli.parse_errors import parse_command_line
from diffusion.cli.phema import main as phema
from diffusion.cli.prepare import main as prepare
from diffusion.cli.sample import main as sample
from diffusion.cli.train import main as train
from diffusion.errors import UserError

LAST = "the last given is used"


def printed_config(argv: list[str], capsys) -> tuple[dict, list[str]]:
    """train.py's --print_config of `argv`: the config it would run, and its notes."""
    with pytest.raises(SystemExit) as exited:
        train([*argv, "--print_config"])
    assert exited.value.code == 0
    out, err = capsys.readouterr()
    return yaml.safe_load(out), [line for line in err.splitlines() if line.startswith("note: ")]


def test_train_takes_the_last_of_a_flag_given_twice_and_says_so(capsys):
    config, notes = printed_config(
        ["--max_steps", "2", "--max_steps", "3", "--model.lr", "1e-3", "--model.lr=0.5"], capsys
    )
    assert config["trainer"]["max_steps"] == 3 and config["model"]["lr"] == 0.5
    assert notes == [
        f"note: --max_steps 2 and then --max_steps 3: {LAST} (--max_steps 3)",  # the shorthand, as typed
        f"note: --model.lr 1e-3 and then --model.lr 0.5: {LAST} (--model.lr 0.5)",
    ]
    # a class's argument, under its two spellings
    config, notes = printed_config(["--data.batch_size", "8", "--data.init_args.batch_size", "16"], capsys)
    assert config["data"]["init_args"]["batch_size"] == 16
    assert notes == [
        f"note: --data.batch_size 8 and then --data.init_args.batch_size 16: {LAST} (--data.init_args.batch_size 16)"
    ]


def test_an_option_of_which_a_list_is_one_form_takes_the_last_too(capsys):
    # --trainer.devices takes 4, [0, 1] or auto: a documented command with --devices 2 added runs on 2
    config, notes = printed_config(["--devices", "4", "--devices", "2", "--accelerator", "cpu"], capsys)
    assert str(config["trainer"]["devices"]) == "2"
    assert notes == [f"note: --devices 4 and then --devices 2: {LAST} (--devices 2)"]
    _, notes = printed_config(
        ["--trainer.devices", "4", "--trainer.devices", "2", "--accelerator", "cpu"], capsys
    )
    assert notes == [f"note: --trainer.devices 4 and then --trainer.devices 2: {LAST} (--trainer.devices 2)"]


def test_a_shorthand_and_its_long_form_that_differ_are_refused_whatever_came_between(capsys):
    # the shorthand twice first (a note), then the long form: still one option under two names
    assert train_line(["--max_steps", "2", "--max_steps", "3", "--trainer.max_steps", "4"], capsys) == (
        "--max_steps 2 and --trainer.max_steps 4 set one option (--max_steps is short for --trainer.max_steps) to "
        "different values — give it once (--max_steps or --trainer.max_steps)"
    )


def test_train_refuses_a_list_of_classes_given_twice(capsys):
    # the first list lost (jsonargparse failed with a traceback); `+=` adds to it
    step_timer, monitor = (
        "diffusion.training.callbacks.StepTimer",
        "lightning.pytorch.callbacks.LearningRateMonitor",
    )
    assert train_line(["--trainer.callbacks", step_timer, "--trainer.callbacks", monitor], capsys) == (
        f"--trainer.callbacks {step_timer} and --trainer.callbacks {monitor} set one option to different values — "
        "give it once, with all its items ([A, B]), or add one with --trainer.callbacks+=B"
    )


def test_train_takes_a_value_twice_and_a_list_added_to(capsys):
    step_timer, monitor = (
        "diffusion.training.callbacks.StepTimer",
        "lightning.pytorch.callbacks.LearningRateMonitor",
    )
    argv = [
        "--max_steps", "3", "--max_steps=3", "--model.lr", "1e-3", "--model.lr", "0.001",
        "--model.network", "UNet", "--model.network", "diffusion.models.UNet",  # a class by its name and its path
        f"--trainer.callbacks+={step_timer}", "--trainer.callbacks.label", "a",
        f"--trainer.callbacks+={monitor}", "--trainer.callbacks.logging_interval", "step",
        f"--trainer.callbacks+={step_timer}", "--trainer.callbacks.label", "b", "--print_config",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        train(argv)
    assert exited.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["trainer"]["max_steps"] == 3 and config["model"]["lr"] == 0.001
    callbacks = [(c["class_path"], c["init_args"]) for c in config["trainer"]["callbacks"]]
    assert [(path, args.get("label")) for path, args in callbacks] == [
        (step_timer, "a"),
        (monitor, None),
        (step_timer, "b"),
    ]
    assert callbacks[1][1]["logging_interval"] == "step"


COMMANDS = {  # id: (command, a command line with a flag twice, the note's two flags)
    "sample": (sample, ["--ckpt", "c.ckpt", "--steps", "3", "--steps=5"], "--steps 3 and then --steps 5"),
    "evaluate": (
        evaluate,
        ["--samples", "s.npz", "--reference", "digits", "--features", "pixels", "--features", "inception"],
        "--features pixels and then --features inception",
    ),
    "evaluate_nll": (evaluate, ["--nll", "--ckpt", "c.ckpt", "--num_images", "8", "--num_images", "16"], "--num_images 8 and then --num_images 16"),
    "export": (export, ["--ckpt", "c.ckpt", "--format", "safetensors", "--format", "diffusers"], "--format safetensors and then --format diffusers"),
    "phema": (phema, ["--run", "r", "--sigma_rel", "0.05", "--sigma_rel", "0.1"], "--sigma_rel 0.05 and then --sigma_rel 0.1"),
    "prepare": (prepare, ["--out", "a", "--out", "b", "--seed", "x"], "--out a and then --out b"),
}  # fmt: skip


@pytest.mark.parametrize(("command", "argv", "said"), COMMANDS.values(), ids=COMMANDS.keys())
def test_every_command_says_which_value_of_a_flag_given_twice_it_takes(
    command, argv, said, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):  # each then refuses its missing file (prepare its seed x)
        command(argv)
    err = capsys.readouterr().err
    assert f"note: {said}: {LAST} ({said.split(' and then ')[1]})" in err.splitlines(), err
    assert "Traceback" not in err and not any(tmp_path.iterdir())


def refused_twice(argv: list[str]) -> str:
    with pytest.raises(UserError) as refusal:
        parse_command_line(a_parser(), argv)
    return str(refusal.value)


def test_a_list_flag_given_twice_is_told_to_give_all_its_values_at_once():
    assert refused_twice(["--out", "o", "--metrics", "fid", "--metrics", "kid"]) == (
        "--metrics fid and --metrics kid set one option to different values — give it once, with all its values "
        "(--metrics A B)"
    )
    assert refused_twice(["--out", "o", "--sweep", "[0.1]", "--sweep", "0.2"]) == (
        "--sweep [0.1] and --sweep 0.2 set one option to different values — give it once, with all its items "
        "([A, B]), or add one with --sweep+=B"
    )


SAME = {  # flags that say one value twice, in two forms
    "number": ["--lr", "1e-3", "--lr=0.001"],
    "words_and_list": ["--metrics", "fid", "kid", "--metrics", "[fid, kid]"],
    "yes_no": ["--overwrite", "--overwrite", "true"],
}


@pytest.mark.parametrize("flags", SAME.values(), ids=SAME.keys())
def test_the_same_value_twice_is_taken(flags):
    parse_command_line(a_parser(), ["--out", "o", *flags])


def test_config_files_layer_and_a_list_added_to_takes_every_value(tmp_path):
    (tmp_path / "a.yaml").write_text("lr: 0.5\nnum_samples: 8\n")
    (tmp_path / "b.yaml").write_text("lr: 0.25\n")
    argv = ["--out", "o", "--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml")]
    config = parse_command_line(a_parser(), [*argv, "--sweep", "[0.1]", "--sweep+=0.2", "--sweep+=0.3"])
    assert (config.lr, config.num_samples, config.sweep) == (0.25, 8, [0.1, 0.2, 0.3])


def test_a_flag_that_is_no_option_is_said_as_such_not_as_given_twice():
    assert refused(["--out", "o", "--guidance", "2", "--guidance", "3"]).startswith(
        "--guidance is not an option of this command"
    )
