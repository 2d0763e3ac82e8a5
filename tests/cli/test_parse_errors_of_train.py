"""train.py (LightningCLI) says a refused command line as the other commands do (test_parse_errors.py), through
its own parse: a bad value of its config file with the file, `--print_config` of the whole command line, a
withdrawn flag, and the forms users write a list flag in.
"""

from pathlib import Path

import pytest
import yaml
from helpers.parse_errors import train_line
from helpers.user_errors import run_in_process, train_args

from diffusion.cli.train import main as train
from diffusion.cli.train_checks import check_settings_from_the_data


def test_train_says_a_bad_value_of_its_config_file_with_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("model:\n  lr: [1, 2]\n  network:\n    init_args:\n      channels: many\n")
    assert train_line(["--config", "run.yaml"], capsys) == (
        "run.yaml: model.lr [1, 2] is not a valid float — pass a value of that type (see --help)"
    )


def test_train_prints_the_config_of_the_whole_command_line(tmp_path, monkeypatch, capsys):
    from diffusion.cli.train import main
    from diffusion.cli.training_run import DEFAULT_CONFIG

    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("model:\n  lr: 0.5\n")
    argv = ["--config", str(DEFAULT_CONFIG), "--print_config", "--config", "run.yaml", "--model.lr", "0.25"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["lr"] == 0.25
    assert train_line(["--print_config", "--model.lr", "abc"], capsys) == (
        "--model.lr abc is not a valid float — pass a value of that type (see --help)"
    )


def test_train_says_a_withdrawn_flag_as_written(capsys):
    assert train_line(["--optimizer.lr", "0.1"], capsys).startswith(
        "--optimizer.lr 0.1: train.py takes no --optimizer; the model configures its own Adam"
    )


def test_train_takes_no_flag_by_a_prefix_of_its_name_and_names_the_near_miss(tmp_path, capsys):
    # `--trainer.max_step 3` set max_steps (argparse's abbreviations), and the notes then named the recipe's file
    # as the source of the 3: refused, naming the flag it is closest to
    assert train_line(["--trainer.max_step", "3"], capsys) == (
        "--trainer.max_step is not an option of this command — write --trainer.max_steps if that is what was meant, "
        "or see --help for the options (--print_config for a full config)"
    )
    assert train_line(["--model.sampling.step", "3"], capsys).startswith(
        "--model.sampling.step is not an option of this command — write --model.sampling.steps if"
    )
    run = tmp_path / "run.yaml"
    run.write_text("trainer:\n  max_step: 3\n")
    assert train_line(["--config", str(run)], capsys).startswith(
        f"{run}: trainer.max_step is not an option of this command — write trainer.max_steps if"
    )


@pytest.mark.parametrize("form", [["0.5", "0.9"], ["0.5,0.9"], ["[0.5, 0.9]"]])
def test_train_takes_a_list_flag_in_the_forms_users_write(form, capsys):
    from diffusion.cli.train import DiffusionCLI

    with pytest.raises(SystemExit):  # parsed, then printed
        DiffusionCLI(["--print_config", "--model.adam_betas", *form, "--trainer.logger", "false"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["adam_betas"] == [0.5, 0.9]


@pytest.mark.parametrize("form", [["1", "2"], ["1,2"], ["[1, 2]"]])
def test_a_list_argument_of_a_chosen_class_takes_the_same_forms(form, capsys):
    """The parser knows its type only from the class: `1 2` was said in its internals ("Expected a <class
    'collections.abc.Sequence'>")."""
    from diffusion.cli.train import DiffusionCLI

    with pytest.raises(SystemExit):
        DiffusionCLI(
            ["--print_config", "--model.network.init_args.channel_mult", *form, "--trainer.logger", "false"]
        )
    assert yaml.safe_load(capsys.readouterr().out)["model"]["network"]["init_args"]["channel_mult"] == [1, 2]


@pytest.mark.parametrize(
    "flags",
    [
        ["--data.image_size", "9"],  # against the network: checked once both are built
        ["--ckpt_path", "missing.ckpt"],  # the checkpoint to resume
        ["--checkpoint.dirpath", "a_file/ckpts"],  # an output folder under a file
        ["--sample_grid.sampling.steps", "5000"],  # the callbacks' checks at fit; printed before them (J6)
        ["--sample_grid.sampling.guidance_scale", "3", "--model.network.init_args.num_classes", "null"],
    ],
    ids=["image_size", "resume", "output_folder", "grid_steps", "grid_guidance"],
)
def test_print_config_refuses_what_the_built_run_would_refuse(flags, tmp_path, monkeypatch, capsys):
    """Checks made once the classes are built run under --print_config too: no config printed for a run that
    would stop, and the same line."""
    monkeypatch.chdir(tmp_path)
    Path("a_file").write_text("")
    refused = train_line(flags, capsys)
    assert train_line(["--print_config", *flags], capsys) == refused


CSV_LOGGER = "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n    init_args:\n"


@pytest.mark.parametrize(
    "file, refused",
    [
        ("data:\n  init_args:\n    batch_size: 0\n", "data.batch_size 0 is out of range (must be >= 1)"),
        ("data:\n  batch_size: 0\n", "data.batch_size 0 is out of range (must be >= 1)"),  # no init_args
        ("trainer:\n  accumulate_grad_batches: 0\n", "trainer.accumulate_grad_batches 0 is out of range"),
        (
            "model:\n  network:\n    init_args:\n      in_channels: 5\n",
            "model.network.in_channels 5: the data sets it",
        ),
        ("model:\n  lr: -0.001\n", "model.lr -0.001 is out of range (must be a finite number > 0)"),
        ("ema:\n  decay: 1.5\n", "ema.decay 1.5 is out of range (must be in (0, 1))"),
        # A sampler's check names no owner: the option holding the value is found, here not --sample_grid's.
        ("model:\n  sampling:\n    sampler: ddim\n    eta: 7\n", "model.sampling.eta 7.0 is out of range"),
        # A class's own check of other kinds: what is wrong said as written, its fix as flags.
        ("model:\n  sampling:\n    steps: 5000\n", "model.sampling.steps 5000 is more steps than the schedule's"),
        ("model:\n  network:\n    init_args:\n      num_heads: 3\n", "model.network.num_heads 3 does not divide"),
        # Lightning took 0 as "train nothing": exit status 0, no checkpoint, no word; and 0 epochs a modulo by 0.
        ("trainer:\n  limit_train_batches: 0\n", "trainer.limit_train_batches 0.0 is out of range"),
        ("trainer:\n  check_val_every_n_epoch: 0\n", "trainer.check_val_every_n_epoch 0 is out of range"),
        # A check with the option's placeholder (not a range): the flag said as the file's key where every
        # command reports.
        ("model:\n  label_dropout: 0.1\n", "model.label_dropout 0.1 needs a class-conditional network"),
    ],
    ids=["class_range", "class_range_without_init_args", "trainer_range", "set_by_the_data", "module_range",
         "ema_range", "sampler_range", "module_check", "network_check", "limit_train_batches_0",
         "check_val_every_n_epoch_0", "reported_check"],
)  # fmt: skip
def test_a_check_after_the_parse_names_the_config_file_that_set_the_value(
    file, refused, tmp_path, monkeypatch, capsys
):
    """The checks made once the command line has parsed (a class's range, the Trainer's, the settings the data
    decides, a sampler's) say a value a config file gave as that file's key, as the parse's own refusals do; a flag given after
    the file wins, and is named."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(file)
    assert train_line(["--config", "run.yaml"], capsys).startswith(f"run.yaml: {refused}")
    key, value = refused.split(" ")[:2]
    flag_after = ["--config", "run.yaml", f"--{key}", value.removesuffix(":")]
    assert train_line(flag_after, capsys).startswith(f"--{refused}")
    if "eta" in key:  # and the sample grid's own sampling options, as flags
        grid = ["--sample_grid.sampling.sampler", "ddim", "--sample_grid.sampling.eta", "7"]
        assert train_line(grid, capsys).startswith("--sample_grid.sampling.eta 7 is out of range")
        # with a sampler that does not take it: still the checkpoint's default of a later `sample --sampler ddim`
        assert train_line(["--model.sampling.eta", "2"], capsys).startswith(
            "--model.sampling.eta 2 is out of"
        )


def test_a_list_of_classes_is_checked_item_by_item(tmp_path, monkeypatch, capsys):
    """A class path inside a list (`--trainer.callbacks`, from a file too) is looked up as itself: the whole list
    read as one class path said `No module named '[{class_path: lightning'`."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(
        "trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.NotACallback\n"
    )
    assert train_line(["--config", "run.yaml"], capsys) == (
        "run.yaml: trainer.callbacks [{class_path: lightning.pytorch.callbacks.NotACallback}]: no such class "
        "(module 'lightning.pytorch.callbacks' has no attribute 'NotACallback') — pass the class path of a class "
        "that exists, as module.Class (see --help for the accepted classes)"
    )
    assert train_line(["--trainer.callbacks", "[{class_path: diffusion.UNet}]"], capsys) == (
        "--trainer.callbacks [{class_path: diffusion.UNet}]: UNet is not a Callback — pass the class path of a "
        "Callback (see --help)"
    )


@pytest.mark.parametrize("group", ["model", "ema", "checkpoint", "sample_grid"])
def test_a_group_written_null_in_a_config_file_is_said_as_such(group, tmp_path, monkeypatch, capsys):
    """`model: null` was the parser's 'the following arguments are required: model.network'; `ema: null` a
    TypeError from deep in the instantiation."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(f"{group}: null\n")
    needs = " (it needs model.network)" if group == "model" else ""
    assert train_line(["--config", "run.yaml"], capsys) == (
        f"run.yaml: {group} null: this group cannot be null{needs} — remove the line, or write its options under it"
    )
    # With a flag of the group after it, the parse passes (a model without its other options: an AttributeError)
    flag = ["--model.network.init_args.channels", "8"] if group == "model" else []
    assert train_line(["--config", "run.yaml", *flag], capsys).startswith(
        f"run.yaml: {group} null: this group"
    )


@pytest.mark.parametrize(
    "file, refused",
    [
        ("trainer: 5\n", "trainer 5: trainer is a group of options, not one value — write its options under it"),
        ("ema:\n  decay: null\n", "ema.decay null: this option takes a float, not null — remove the line for the "
                                  "default (0.9999), or write a value"),
        ("model:\n  network:\n    init_args: [8]\n", "model.network.init_args [8]: init_args holds the arguments "
                                                      "of the class, by name"),
        # Round 5's G14: in the parser's own words before
        ("model:\n  network:\n    init_args: null\n", "model.network.init_args null: init_args holds the "
                                                        "arguments of the class, by name"),
        ("trainer:\n  default_root_dir: 5\n", "trainer.default_root_dir 5 is a number, not a path — write it in "
                                               "quotes: '5'"),
        # NaN equals nothing: the option holding it was not found, and the line named none (as a flag the parser
        # refuses it).
        ("model:\n  sampling:\n    sampler: ddim\n    eta: .nan\n", "model.sampling.eta nan is out of range"),
        # Round 4's G7 and G8: a TypeError in LightningCLI's instantiation, an AttributeError in the Trainer's checks
        ("trainer: null\n", "trainer null: this group cannot be null — remove the line"),
        ("model:\n  sampling: null\n", "model.sampling null: this group cannot be null — remove the line"),
        # The option written, not only the one it clashes with (said a default the user never wrote)
        ("model:\n  trained_betas: [0.1, 0.2]\n", "model.trained_betas: --model.beta_schedule linear takes none"),
    ],
    ids=["a_group_as_one_value", "a_null_where_none_goes", "init_args_as_a_list", "init_args_null",
         "a_number_where_a_path_goes", "nan", "trainer_null", "sampling_null", "trained_betas"],
)  # fmt: skip
def test_what_the_parser_lets_through_from_a_file_is_refused_naming_the_key(
    file, refused, tmp_path, monkeypatch, capsys
):
    """A config file's values the parser takes but the command cannot use ended in a traceback deep in the run
    (an AttributeError, a TypeError) or in the parser's own words."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(file)
    assert train_line(["--config", "run.yaml"], capsys).startswith(f"run.yaml: {refused}")


@pytest.mark.parametrize(
    "arguments, refused",
    [("name: [a, b]", "trainer.logger.init_args.name [a, b] is a list, not a str — write one value (see --help)"),
     ("save_dir: null", "trainer.logger.init_args.save_dir null: this option takes a str or a Path, not null — "
                        "remove the line, or write a value")],
    ids=["of_another_type", "null"],
)  # fmt: skip
def test_a_bad_argument_of_a_chosen_class_is_blamed_not_the_class(
    arguments, refused, tmp_path, monkeypatch, capsys
):
    """Round 5's G15: said "trainer.logger lightning.pytorch.loggers.CSVLogger is not a valid Logger or list or
    bool" (the class path alone does not parse: CSVLogger needs its save_dir)."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(CSV_LOGGER + f"      {arguments}\n")
    assert train_line(["--config", "run.yaml"], capsys, logger=None) == f"run.yaml: {refused}"
    # As flags: the argument's text is YAML to the parser (a probe of its type alone took `[a,b]` as a str)
    name, value = arguments.split(": ")
    flags = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.init_args.{name}"]
    assert train_line([*flags, value.replace(" ", "")], capsys, logger=None) == "--" + refused.replace(
        "[a, b]", "[a,b]"
    ).replace("remove the line", "leave the flag out")


def test_a_group_file_given_as_a_flag_is_said_as_that_files_key(tmp_path, monkeypatch, capsys):
    """`--data data.yaml` chooses the data module from a file: its values are the file's, as a --config's are."""
    monkeypatch.chdir(tmp_path)
    Path("data.yaml").write_text("init_args:\n  batch_size: 0\n")
    Path("net.yaml").write_text("class_path: diffusion.UNet\ninit_args:\n  channels: 0\n")
    assert train_line(["--data", "data.yaml"], capsys).startswith(
        "data.yaml: data.batch_size 0 is out of range"
    )
    line = train_line(["--model.network", "net.yaml"], capsys)
    assert line.startswith("net.yaml: model.network.channels 0 is out of range"), line
    # Round 5's G13: the file said "no such class"; what is wrong is its init_args
    for init_args in ("null", "[1, 2]"):
        Path("data.yaml").write_text(f"class_path: diffusion.data.ImageDataModule\ninit_args: {init_args}\n")
        assert train_line(["--data", "data.yaml"], capsys) == (
            f"data.yaml: data.init_args {init_args}: init_args holds the arguments of the class, by name — write "
            "them under it as name: value lines (e.g. channels: 64)"
        )


def test_a_class_file_named_in_a_config_file_is_said_as_that_files_key(tmp_path, monkeypatch, capsys):
    """Round 5a's H5 and H6: `data: data.yaml` or `network: net.yaml` in run.yaml (read from its folder) said
    "no such class (No module named 'net')" of a bad value in the file, and a range checked after the parse named
    no file (`--data.batch_size 0`); both are said as that file's keys, as `--data configs/data.yaml` says them."""
    monkeypatch.chdir(tmp_path)
    Path("configs").mkdir()
    Path("configs/run.yaml").write_text("data: data.yaml\nmodel:\n  network: net.yaml\n")
    Path("configs/net.yaml").write_text("class_path: diffusion.UNet\ninit_args:\n  channels: abc\n")
    Path("configs/data.yaml").write_text(
        "class_path: diffusion.ImageDataModule\ninit_args:\n  batch_size: 0\n"
    )
    assert train_line(["--config", "configs/run.yaml"], capsys) == (
        "configs/net.yaml: model.network.init_args.channels abc is not a valid int — pass a value of that type "
        "(see --help)"
    )
    Path("configs/net.yaml").write_text("class_path: diffusion.UNet\n")
    assert train_line(["--config", "configs/run.yaml"], capsys).startswith(
        "configs/data.yaml: data.batch_size 0 is out of range"
    )


def test_a_network_of_another_kind_is_refused_before_anything_is_built(tmp_path, monkeypatch, capsys):
    """Round 4's G9: torch.nn.Linear (forward(input)) trained into forward's TypeError at the first step."""
    from diffusion.cli.train_checks import check_network_class

    monkeypatch.chdir(tmp_path)
    linear = ["--model.network.init_args.in_features", "4", "--model.network.init_args.out_features", "4"]
    refused = (
        "model.network torch.nn.Linear: Linear is no noise-prediction network (its forward takes (input), not "
        "(x, t, y=None)) — pass a diffusion.models network such as diffusion.models.UNet (diffusion.models.MLP for "
        "vectors), or a torch.nn.Module whose forward takes (x, t, y=None)"
    )
    assert train_line(["--model.network", "torch.nn.Linear", *linear], capsys) == f"--{refused}"
    Path("run.yaml").write_text(
        "model:\n  network:\n    class_path: torch.nn.Linear\n    init_args: {in_features: 4, out_features: 4}\n"
    )
    assert train_line(["--config", "run.yaml"], capsys) == f"run.yaml: {refused}"
    for network in ("diffusion.UNet", "diffusion.models.MLP", "helpers.tiny_sampler.TinyNetwork"):
        check_network_class(network)  # the project's networks, and a user's of the contract's call


def test_a_class_of_the_right_kind_without_its_required_arguments_names_them(tmp_path, monkeypatch, capsys):
    """`--model.network torch.nn.Linear` alone was "not a valid Module": it is one, lacking its arguments."""
    monkeypatch.chdir(tmp_path)
    needs = (
        "model.network torch.nn.Conv2d: Conv2d needs in_channels, out_channels, kernel_size, which have no default "
        "— give them as --model.network.init_args.in_channels VALUE, or under init_args: in a config file"
    )
    assert train_line(["--model.network", "torch.nn.Conv2d"], capsys) == f"--{needs}"
    Path("run.yaml").write_text("model:\n  network: torch.nn.Conv2d\n")
    assert train_line(["--config", "run.yaml"], capsys) == f"run.yaml: {needs}"
    # a logger by its bare name, its recipe's save_dir dropped by a `false` before it: "is not a valid Logger or list
    # or bool — pass ... a list in brackets, e.g. [1, 2]"
    assert train_line(
        ["--trainer.logger", "false", "--trainer.logger", "CSVLogger"], capsys, logger=None
    ) == (
        "--trainer.logger CSVLogger: CSVLogger needs save_dir, which has no default — give it as "
        "--trainer.logger.init_args.save_dir VALUE, or under init_args: in a config file"
    )


def test_a_network_setting_the_data_decides_is_refused_from_a_config_file_too(user, tmp_path, capsys):
    written = tmp_path / "network.yaml"
    written.write_text("model:\n  network:\n    init_args:\n      in_channels: 3\n")
    flags = ["--config", "{configs}/digits.yaml", "--config", str(written)]
    line = run_in_process(train, train_args(flags, user, user / "runs"), user, capsys)
    assert f"{written}: model.network.in_channels 3: the data sets it (1 here" in line  # the file that set it
    # Read by the parser, so in every form it reads: a group's own config file, and JSON on the command line.
    group_file = tmp_path / "unet.yaml"
    group_file.write_text("class_path: diffusion.models.UNet\ninit_args:\n  in_channels: 3\n")
    as_json = (
        '{{"class_path": "diffusion.models.UNet", "init_args": {{"num_classes": 10}}}}'  # train_args formats
    )
    for network, said in [
        (str(group_file), f"{group_file}: model.network.in_channels 3"),  # a class's own file: its key
        (as_json, "--model.network.num_classes 10"),
    ]:
        flags = ["--config", "{configs}/digits.yaml", "--model.network", network]
        line = run_in_process(train, train_args(flags, user, user / "runs"), user, capsys)
        assert f"{said}: the data sets it" in line
    # A value equal to the data's is no mistake (a config of an earlier version).
    check_settings_from_the_data(
        {"in_channels": 1}, {"in_channels": 1, "num_classes": None, "out_channels": None}
    )


def test_a_group_file_missing_or_a_whole_config_is_said_as_a_file_not_a_class(tmp_path, monkeypatch, capsys):
    """`--model.network net.yaml` names a file: one missing, or a whole config in its place, was said `no such
    class (No module named 'net')` (J10)."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text("model:\n  network: /nonexistent/net.yaml\n")
    Path("whole.yaml").write_text("model:\n  lr: 1e-3\n")
    missing = "no such file — pass the path of an existing YAML file of its class_path and init_args"
    assert train_line(["--config", "run.yaml"], capsys).startswith(
        f"run.yaml: model.network /nonexistent/net.yaml: {missing}"
    )
    assert train_line(["--model.network", "net.yaml"], capsys).startswith(
        f"--model.network net.yaml: {missing}"
    )
    whole = (
        "the file is a whole config (its keys: model), not this option's class_path and init_args — pass it"
    )
    for flag in ("--model.network", "--data"):
        assert train_line([flag, "whole.yaml"], capsys).startswith(f"{flag} whole.yaml: {whole}")


def test_a_shorthand_and_its_long_form_with_different_values_are_refused(capsys):
    """Round 10's S4: `--trainer.max_steps 3 --max_steps 4` kept the last without a word."""
    assert train_line(["--trainer.max_steps", "3", "--max_steps", "4"], capsys) == (
        "--trainer.max_steps 3 and --max_steps 4 set one option (--max_steps is short for --trainer.max_steps) to "
        "different values — give it once (--max_steps or --trainer.max_steps)"
    )
