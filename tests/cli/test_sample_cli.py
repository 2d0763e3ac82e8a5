"""`python -m diffusion.sample`: checkpoint in, samples.npz + grid.png out, on the tiny fixture checkpoints.

Every run passes --sampler and --steps, so that these tests do not depend on the recipes' default samplers.
"""

import inspect
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import warm
from PIL import Image

import diffusion
from diffusion.cli.sample import main
from diffusion.core.samplers.contract import Sampler
from diffusion.core.sampling import SAMPLERS
from diffusion.training.loading import load_checkpoint

REPO_ROOT = Path(__file__).parents[2]
BASE = ["--num_samples", "5", "--batch_size", "5", "--seed", "7", "--sampler", "ddim", "--steps", "3",
        "--device", "cpu"]  # fmt: skip


def override(args: list[str], **flags: str) -> list[str]:
    """`args` with the value after each --flag replaced (flag names as keyword arguments)."""
    args = list(args)
    for flag, value in flags.items():
        args[args.index(f"--{flag}") + 1] = value
    return args


@pytest.fixture(scope="module")
def sample_digits(digits_checkpoint, tmp_path_factory):
    """Run the CLI on the digits checkpoint with BASE (+ overrides) into a fresh folder; memoized per args."""
    runs: dict[tuple[str, ...], tuple[np.ndarray, Path]] = {}

    def run(*extra: str, **flags: str) -> tuple[np.ndarray, Path]:
        args = (*override(BASE, **flags), *extra)
        if args not in runs:
            out = tmp_path_factory.mktemp("samples")
            path = main(["--ckpt", str(digits_checkpoint), "--out", str(out), *args])
            assert path == out / "samples.npz"
            runs[args] = np.load(path)["arr_0"], out
        return runs[args]

    return run


def test_image_samples_are_uint8_nhwc_with_a_grid(sample_digits):
    samples, out = sample_digits()
    assert samples.dtype == np.uint8
    assert samples.shape == (5, 8, 8, 1)
    with Image.open(out / "grid.png") as grid:
        grid.load()
        assert grid.width > 16 and grid.height > 16


def test_samples_depend_on_the_seed_but_not_on_the_batch_size(sample_digits):
    reference, _ = sample_digits()  # --batch_size 5: one batch
    np.testing.assert_array_equal(sample_digits(batch_size="2")[0], reference)  # batches of 2, 2, 1
    assert not np.array_equal(sample_digits(seed="8")[0], reference)


def test_raw_weights_give_different_samples_than_ema(sample_digits, digits_checkpoint):
    # Precondition: after a few training steps the fixture's EMA weights differ from the raw ones.
    ema = load_checkpoint(digits_checkpoint, weights="ema").state_dict()
    raw = load_checkpoint(digits_checkpoint, weights="raw").state_dict()
    assert any(not torch.equal(ema[key], raw[key]) for key in ema), "fixture EMA equals raw weights"
    assert not np.array_equal(sample_digits("--weights", "raw")[0], sample_digits()[0])


def test_ddim_and_ddpm_samplers_both_run_and_differ(sample_digits):
    ddim, _ = sample_digits()
    ddpm, _ = sample_digits(sampler="ddpm", steps="5")
    assert ddpm.shape == ddim.shape == (5, 8, 8, 1)
    assert not np.array_equal(ddim, ddpm)


def test_vector_samples_are_float32_points_with_a_scatter_plot(toy2d_checkpoint, tmp_path):
    path = main(["--ckpt", str(toy2d_checkpoint), "--out", str(tmp_path), *override(BASE, num_samples="6")])
    samples = np.load(path)["arr_0"]
    assert samples.dtype == np.float32
    assert samples.shape == (6, 2)
    assert np.isfinite(samples).all()
    with Image.open(tmp_path / "grid.png") as grid:
        grid.load()


def test_module_runs_as_a_script(digits_checkpoint, tmp_path):
    out = tmp_path / "out"
    # Forked warm (helpers/warm.py): `-m` runs the module as __main__ there too (runpy, as the interpreter does).
    result = warm.run(
        [sys.executable, "-m", "diffusion.sample", "--ckpt", str(digits_checkpoint), "--num_samples", "3",
         "--steps", "3", "--device", "cpu", "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert str(out / "samples.npz") in result.stdout
    assert np.load(out / "samples.npz")["arr_0"].shape == (3, 8, 8, 1)


def test_missing_checkpoint_names_the_path(tmp_path, monkeypatch):
    # The exception itself, not its one-line report (that is in cli/test_train_errors.py).
    monkeypatch.setenv("DIFFUSION_DEBUG", "1")
    missing = tmp_path / "nope" / "last.ckpt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        main(["--ckpt", str(missing), "--out", str(tmp_path / "out"), "--steps", "3", "--device", "cpu"])
    assert not (tmp_path / "out").exists()


def test_zero_samples_is_an_argparse_error(digits_checkpoint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(digits_checkpoint), "--num_samples", "0", "--steps", "3"])
    assert exit_info.value.code == 2
    assert "--num_samples" in capsys.readouterr().err


def test_cuda_without_a_gpu_says_to_use_the_cpu(digits_checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on machines that have a GPU
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(digits_checkpoint), "--device", "cuda", "--steps", "3"])
    assert exit_info.value.code == 2
    assert "--device cpu" in capsys.readouterr().err


def test_print_config_gives_a_config_file_that_repeats_the_run(
    sample_digits, digits_checkpoint, tmp_path, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(digits_checkpoint), *BASE, "--out", str(tmp_path / "printed"), "--print_config"])
    assert exit_info.value.code == 0
    config = tmp_path / "sample.yaml"
    config.write_text(capsys.readouterr().out)
    path = main(["--config", str(config), "--out", str(tmp_path / "out")])
    np.testing.assert_array_equal(np.load(path)["arr_0"], sample_digits()[0])


def test_print_config_refuses_what_the_command_refuses(digits_checkpoint, tmp_path, capsys):
    """Printed only once the command's own checks pass (the checkpoint, --out, the labels): no config of a
    command that would stop."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "samples.npz").write_bytes(b"the user's")
    missing_checkpoint = ["--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "new")]
    samples_there = ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "taken")]
    too_many_steps = ["--ckpt", str(digits_checkpoint), "--out", str(tmp_path / "new"), "--steps", "5000"]
    for flags in (missing_checkpoint, samples_there, too_many_steps):
        with pytest.raises(SystemExit) as exit_info:
            main(["--print_config", *flags])
        assert exit_info.value.code == 2
        assert capsys.readouterr().out == ""


def test_a_bare_sample_command_on_the_default_recipes_checkpoint_draws_its_best_sampler_per_cost(
    digits_checkpoint,
):
    # The digits recipe's quality table: 20 steps of dpmpp_2m_sde reach DDPM-1000's FD at 1/50 of its cost.
    module = load_checkpoint(digits_checkpoint)
    assert (module.sampling.sampler, module.sampling.steps) == ("dpmpp_2m_sde", 20)
    calls = []
    original = module.network.forward
    module.network.forward = lambda *args: calls.append(1) or original(*args)
    module.sample(2, seed=0)
    assert len(calls) == 20  # one network evaluation per step


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_from_the_sampler_flag_to_the_samplers_steps_is_three_files_one_way(
    name, digits_checkpoint, tmp_path, monkeypatch
):
    # docs/layout.md's sampling walk. Resolving: where the sampler is built, the package's code on the stack is
    # the sample command and core/sampling.py (the sampler's file too, where it has its own checks). Running: at a
    # sampler's step, the sample command, generation on ranks and the sampler's own file. Never training/ (the
    # model's defaults are read from it, not routed through it), never cli/flags.py, and no file twice.
    package = Path(diffusion.__file__).parent
    built, stepped = [], []

    def package_files(stack) -> list[str]:
        files = [Path(frame.filename) for frame in stack[1:]]
        return list(
            dict.fromkeys(str(path.relative_to(package)) for path in files if path.is_relative_to(package))
        )

    checks, predict = Sampler.__post_init__, Sampler.predict

    def recording_checks(self):
        built.append(package_files(inspect.stack(context=0)))
        return checks(self)

    def recording_predict(self, *args, **kwargs):  # called by the sampler's step 1, from its own file
        stepped.append(package_files(inspect.stack(context=0)))
        return predict(self, *args, **kwargs)

    monkeypatch.setattr(Sampler, "__post_init__", recording_checks)
    monkeypatch.setattr(Sampler, "predict", recording_predict)
    main(["--ckpt", str(digits_checkpoint), "--out", str(tmp_path), *override(BASE, sampler=name, steps="2")])
    sampler_file = str(Path(inspect.getfile(SAMPLERS[name])).relative_to(package))
    # The first build checks the flags as they are made (before the checkpoint loads); the last is the sampler
    # that runs: the flags over the checkpoint's defaults.
    own_checks = [sampler_file] if "__post_init__" in vars(SAMPLERS[name]) else []
    assert built[0] == [*own_checks, "core/sampling.py", "cli/sample.py"]
    assert built[-1] == [*own_checks, "core/sampling.py", "cli/sample.py"]
    assert stepped[0] == [sampler_file, "generation/ranks.py", "cli/sample.py"]


def test_a_checkpoint_named_in_a_config_file_is_said_with_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample.yaml").write_text("ckpt: nothere.ckpt\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", "sample.yaml", "--out", "out"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: sample.yaml: ckpt: no checkpoint at nothere.ckpt — ")
    )


def test_an_option_the_chosen_sampler_does_not_take_is_said_not_dropped(digits_checkpoint, tmp_path, capsys):
    main(["--ckpt", str(digits_checkpoint), *override(BASE, sampler="ddpm", steps="2"), "--eta", "0.5",
          "--out", str(tmp_path / "out")])  # fmt: skip
    assert "note: --eta is no option of the ddpm sampler: not used (ddim, euler_ancestral take it)" in (
        capsys.readouterr().err
    )
    main(
        [
            "--ckpt",
            str(digits_checkpoint),
            *override(BASE, steps="2"),
            "--eta",
            "0.5",
            "--out",
            str(tmp_path / "b"),
        ]
    )
    assert "note:" not in capsys.readouterr().err  # ddim takes eta


def test_out_under_home_in_a_config_file_is_written_there(toy2d_checkpoint, tmp_path, monkeypatch):
    # `out: ~/x` wrote into a folder literally named ~ in the current folder; export expands it (J8).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample.yaml").write_text(f"ckpt: {toy2d_checkpoint}\nout: ~/x\n")
    path = main(["--config", "sample.yaml", *override(BASE, num_samples="2")])
    assert path == tmp_path / "home" / "x" / "samples.npz"
    assert path.is_file() and not (tmp_path / "~").exists()


def test_a_sampler_given_without_steps_says_it_takes_the_checkpoints_steps(
    digits_checkpoint, tmp_path, capsys
):
    """Round 17a's G1: `--sampler ddpm` on a digits checkpoint (dpmpp_2m_sde, 20 steps) ran 20 DDPM steps without a
    word, where the recipe's comment promised the paper's 1,000."""
    default = load_checkpoint(digits_checkpoint).sampling
    assert default.sampler != "ddpm" and default.steps is not None
    args = ["--ckpt", str(digits_checkpoint), "--num_samples", "2", "--device", "cpu", "--sampler", "ddpm"]
    main([*args, "--out", str(tmp_path / "a")])
    assert (
        f"note: --sampler ddpm takes the checkpoint's --steps {default.steps} (chosen for its sampler "
        in (capsys.readouterr().err)
    )
    main([*args, "--steps", "2", "--out", str(tmp_path / "b")])
    assert "note:" not in capsys.readouterr().err  # the steps given


def test_clipping_a_vector_models_samples_is_noted(toy2d_checkpoint, digits_checkpoint, tmp_path, capsys):
    # Round 25a's R2: standardized vectors clipped to [-1, 1] were squeezed toward their mean without a word
    args = [*override(BASE, sampler="ddim", steps="2", num_samples="4"), "--clip_denoised", "true"]
    main(["--ckpt", str(toy2d_checkpoint), *args, "--out", str(tmp_path / "v")])
    assert (
        "note: --clip_denoised true clips each predicted x_0 to [-1, 1], where vectors lie only if trained with "
        "--data.normalize minmax (standardized, the default, they spread beyond it): the samples would be squeezed "
        "toward the mean — leave --clip_denoised false unless this model's data were min-max scaled"
    ) in capsys.readouterr().err
    main(["--ckpt", str(digits_checkpoint), *args, "--out", str(tmp_path / "i")])  # images lie in [-1, 1]
    assert "note:" not in capsys.readouterr().err
