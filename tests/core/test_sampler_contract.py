"""The contract every registered sampler keeps (`diffusion.core.sampling.SAMPLERS`): each test runs for every
sampler in the registry, so a new sampler is tested by registering it. The registry describes it; its trajectory
starts at t = T - 1; a sample does not depend on its batch, nor (deterministic samplers) on anything but x_T; one
process and two draw the same samples; guidance and learned variances work where it takes them and are refused in
one line where not; so does a zero-terminal-SNR schedule (alpha_bar_T = 0), from which a sampler's samples converge
to the data; it costs the network evaluations it says (`evaluations`); compiled, it draws the eager samples from
one graph; golden values computed by the code before the samplers had one contract (571722a), and for samplers added
since by their first version, stay (convergence toward DDPM-1000: test_sampler_convergence.py).

The tiny model: tests/helpers/tiny_sampler.py.
Run as a script (`python tests/core/test_sampler_contract.py OUT.pt`), this file draws every sampler's samples
on two processes (Lightning Fabric, gloo) and writes rank 0's gathered samples to OUT.pt.
"""

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from helpers import warm
from helpers.tiny_sampler import (  # noqa: F401 (_one_thread: autouse)
    LABELS,
    NAMES,
    STD,
    T,
    TinyNetwork,
    _one_thread,
    frechet_distance,
    gaussian_fit,
    guided,
    options,
    tiny_module,
)
from torch import nn

from diffusion.cli.jsonargparse_internals import actions
from diffusion.cli.sample import build_parser
from diffusion.core.guidance import NO_LABEL
from diffusion.core.noise import PerSampleNoise
from diffusion.core.samplers.contract import Sampler
from diffusion.core.samplers.ddpm_ddim import DDIM, DDPM
from diffusion.core.sampling import SAMPLERS, SamplingOptions, options_of, reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.data.labels import class_labels
from diffusion.generation.ranks import gather_in_order, generate

REPO_ROOT = Path(__file__).parents[2]
TRAINING_DOC = (REPO_ROOT / "docs" / "training.md").read_text()
# module.sample(3, seed=11, options=SamplingOptions(sampler=name, steps=5[, guidance_scale=1.5]), labels=...) of
# tiny_module() ("plain": no labels; "guided": LABELS, guidance 1.5) and of tiny_module(learned_variance=True)
# ("learned", where the sampler uses the learned variance; the others sample as "plain"), by the code at 571722a;
# those of heun and euler_ancestral computed once by their first version.
GOLDEN = {
    "ddpm": {
        "plain": [[0.92063999, -0.24789509, -0.38802233, 1.0], [0.03098354, -1.0, -0.49679521, 0.26939976],
                  [0.47177753, -1.0, -0.78199309, 0.04116568]],
        "guided": [[-0.61440468, 0.36871248, -1.0, 1.0], [-1.0, -1.0, -1.0, -0.63089889],
                   [-1.0, 0.43396980, -0.61088932, 0.28793573]],
        "learned": [[0.87070411, -0.31859741, 0.06148310, 0.78118432], [0.36875147, -0.77080137, -0.02961949, 0.13441922],
                    [0.66993630, -0.81823087, 0.01459038, 0.61365181]],
    },
    "ddim": {
        "plain": [[0.45830095, -0.57330132, 0.06283987, 0.25506023], [0.48421687, -0.81014365, 0.01352033, 0.79197860],
                  [0.60440165, -0.51795679, 0.03758395, 0.90555221]],
        "guided": [[-1.0, 0.03115962, -0.80328190, 0.73491669], [-1.0, -0.84325075, -0.52719897, -0.09265729],
                   [-0.99536318, 1.0, 0.20917924, 1.0]],
    },
    "dpmpp_2m": {
        "plain": [[0.69413275, -0.36427104, 0.28235039, 0.55735618], [0.53550041, -0.76791894, 0.14164859, 1.0],
                  [0.85756433, -0.24700083, 0.12159389, 1.0]],
        "guided": [[-1.0, 0.34282413, -0.64759290, 1.0], [-1.0, -0.81369394, -0.41438618, 0.41171870],
                   [-0.97185040, 1.0, 0.29653934, 1.0]],
    },
    "dpmpp_2m_sde": {
        "plain": [[0.88922352, -0.53850287, 0.32752240, 0.15382969], [0.44321227, -0.74495995, 0.10968325, 0.02024639],
                  [0.99444461, -0.88814062, -0.11410423, 0.83896053]],
        "guided": [[-0.99542391, 0.19168787, -0.67688936, 0.63847005], [-1.0, -0.79066104, -0.44638139, -0.94341493],
                   [-0.91521430, 0.99306113, 0.05573481, 0.99106079]],
    },
    "heun": {
        "plain": [[0.83835721, 0.23096432, 0.75257939, 0.63234800], [0.11406957, -0.97141469, 0.31235567, 1.0],
                  [1.0, 0.78931987, 0.11271245, 1.0]],
        "guided": [[-1.0, 1.0, -0.04569207, 1.0], [-1.0, -1.0, -0.19893047, 1.0], [-0.88388300, 1.0, 0.37626916, 1.0]],
    },
    "euler_ancestral": {
        "plain": [[0.49821126, -0.88771582, 0.05439133, 0.47225463], [0.36751503, -0.76061356, -0.01282981, 0.03491754],
                  [0.66795754, -0.62945914, -0.00164651, 0.43813989]],
        "guided": [[-0.99533015, -0.26786071, -0.80894989, 0.95992875], [-1.0, -0.79735082, -0.54485971, -0.82379293],
                   [-1.0, 0.99182081, 0.17660223, 0.99020791]],
    },
}  # fmt: skip


# ---- the registry ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_registry_describes_the_sampler_and_every_layer_offers_its_options(name):
    sampler = SAMPLERS[name]
    assert issubclass(sampler, Sampler) and sampler.name == name and sampler.summary
    assert sampler.default_steps is None or sampler.default_steps >= 1
    assert sampler() is not None  # every option has a default
    options_fields = {option.name for option in fields(SamplingOptions)}
    flags = {action.dest for action in actions(build_parser())}
    for option in options_of(sampler).values():
        assert option.metadata.get("help"), f"{name}.{option.name} has no help: declare it with option()"
        assert option.name in options_fields and option.name in flags
    assert name in SamplingOptions.__doc__ and sampler.summary in SamplingOptions.__doc__
    # docs/training.md's table of samplers has its row, with its default steps.
    rows = [line for line in TRAINING_DOC.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1 and f"| {sampler.default_steps_text()} |" in rows[0], (
        f"docs/training.md: {name}'s row"
    )


@pytest.mark.parametrize("name", NAMES)
def test_a_trajectory_starts_at_the_noise_of_x_T_and_takes_steps_steps(name):
    module = tiny_module()
    x_T, noise = module.initial_noise(3, seed=0)
    trajectory = list(module.trajectory(x_T, noise, options(name, steps=6)))
    timesteps = [step.t for step in trajectory]
    assert (
        len(trajectory) == 6 and timesteps[0] == T - 1 and timesteps == sorted(set(timesteps), reverse=True)
    )
    assert all(step.x.shape == step.x0.shape == x_T.shape for step in trajectory)
    default = module.sampler(SamplingOptions(sampler=name))
    assert default.steps_for(T) == (
        T if SAMPLERS[name].default_steps is None else SAMPLERS[name].default_steps
    )


# ---- per-sample seeds and processes ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_a_sample_does_not_depend_on_the_batch_it_is_in(name):
    module = tiny_module()
    labels = torch.tensor([0, 1, 2, NO_LABEL, 1, 0])
    draw = {"seed": 3, "options": options(name, **guided(name))}
    at_once = module.sample(6, labels=labels, **draw)
    in_two = torch.cat([module.sample(2, indices=torch.arange(2), labels=labels[:2], **draw),
                        module.sample(4, indices=torch.arange(2, 6), labels=labels[2:], **draw)])  # fmt: skip
    torch.testing.assert_close(in_two, at_once, rtol=0, atol=1e-6)
    assert len({tuple(sample.flatten().tolist()) for sample in at_once}) == 6  # each its own noise


@pytest.mark.parametrize("name", NAMES)
def test_a_deterministic_sampler_depends_on_x_T_alone_and_a_stochastic_one_on_its_noise(name):
    module = tiny_module()
    x_T, _ = module.initial_noise(4, seed=0)
    sampler = module.sampler(options(name))
    noises = [PerSampleNoise(seed, torch.arange(4)) for seed in (1, 2)]  # the same x_T, other noise after it
    samples = [list(module.trajectory(x_T, noise, options(name)))[-1].x for noise in noises]
    if sampler.deterministic:
        torch.testing.assert_close(samples[0], samples[1], rtol=0, atol=0)
    else:
        assert (samples[0] - samples[1]).abs().max() > 1e-3


def two_process_options(name: str) -> SamplingOptions:
    return options(name, steps=3, **guided(name))


@pytest.mark.multiprocess
def test_two_processes_draw_one_processs_samples(tmp_path):
    result = warm.run(
        [sys.executable, __file__, str(tmp_path / "two.pt")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT / "tests")},  # helpers.tiny_sampler
        ranks=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    two = torch.load(tmp_path / "two.pt")
    assert set(two) == set(NAMES)
    module = tiny_module()
    for name in NAMES:
        one = generate(
            module, 5, sampler=module.sampler(two_process_options(name)), seed=7, labels=class_labels(5, 3)
        )
        torch.testing.assert_close(two[name], one, rtol=0, atol=1e-6, msg=name)


def draw_on_two_processes(out: Path) -> None:
    """Every sampler's 5 samples, drawn by two processes in batches of 2, gathered in index order by rank 0."""
    from lightning.fabric import Fabric

    from diffusion.cli.process_group import closing_process_group

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    with closing_process_group():
        module, gathered = tiny_module(), {}
        for name in NAMES:
            local = generate(
                module, 5, sampler=module.sampler(two_process_options(name)), seed=7, batch_size=2, rank=fabric.global_rank,
                world_size=fabric.world_size, labels=class_labels(5, 3),
            )  # fmt: skip
            gathered[name] = gather_in_order(local, 5, fabric.all_gather)
        if fabric.global_rank == 0:
            torch.save(gathered, out)
        fabric.barrier()


# ---- guidance, learned variances, zero terminal SNR ------------------------------------------------------------
class GuidedByHand(nn.Module):
    """Classifier-free guidance written out: two forwards, out_uncond + s (out_cond - out_uncond)."""

    def __init__(self, network: nn.Module, labels: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.network, self.labels, self.scale = network, labels, scale

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        conditional = self.network(x, t, self.labels)
        unconditional = self.network(x, t, torch.full_like(self.labels, NO_LABEL))
        return unconditional + self.scale * (conditional - unconditional)


@pytest.mark.parametrize("name", NAMES)
def test_guidance_guides_every_step_or_is_refused_in_one_line(name):
    schedule, network = NoiseSchedule(num_timesteps=T), TinyNetwork()
    x_T = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(0))

    def run(model, labels=None, **more):
        steps = reverse_steps(model, schedule, x_T, labels=labels, generator=PerSampleNoise(5, torch.arange(3)),
                              sampler=name, steps=4, **more)  # fmt: skip
        return [step.x for step in steps]

    if not SAMPLERS[name].takes_guidance:
        with pytest.raises(
            ValueError, match=rf"^sampler {name} does not take classifier-free guidance .* — "
        ):
            run(network, LABELS, guidance_scale=1.5)
        return
    ours, by_hand = run(network, LABELS, guidance_scale=1.5), run(GuidedByHand(network, LABELS, 1.5))
    for step, step_by_hand in zip(ours, by_hand, strict=True):  # guided at every step
        torch.testing.assert_close(step, step_by_hand, rtol=0, atol=1e-6)
    unconditional = run(network, torch.full_like(LABELS, NO_LABEL))[-1]
    torch.testing.assert_close(run(network, LABELS, guidance_scale=0.0)[-1], unconditional, rtol=0, atol=0)
    assert (run(network, LABELS)[-1] - unconditional).abs().max() > 0.1  # the labels matter


@pytest.mark.parametrize("name", NAMES)
def test_learned_variances_are_used_or_left_aside_or_refused_in_one_line(name):
    learned = tiny_module(learned_variance=True)
    if not SAMPLERS[name].takes_learned_variance:
        with pytest.raises(
            ValueError, match=rf"^sampler {name} does not take a network with learned variances — "
        ):
            learned.sample(3, seed=11, options=options(name))
        return
    sample = learned.sample(3, seed=11, options=options(name))
    prediction_only = tiny_module().sample(3, seed=11, options=options(name))  # the same eps, no v
    if learned.sampler(options(name)).uses_learned_variance:
        assert (sample - prediction_only).abs().max() > 0.05
    else:
        torch.testing.assert_close(sample, prediction_only, rtol=0, atol=0)


@dataclass(frozen=True)
class Refusing(DDIM):
    """A test-only sampler that takes neither guidance, learned variances nor alpha_bar_T = 0: the refusals are one
    class line each."""

    name: ClassVar[str] = "refusing"
    takes_guidance: ClassVar[bool] = False
    takes_learned_variance: ClassVar[bool] = False
    takes_zero_terminal_snr: ClassVar[bool] = False


def test_what_a_sampler_does_not_take_is_refused_in_one_line():
    schedule = NoiseSchedule("cosine", num_timesteps=10)  # linear betas reach 1 at T <= 20
    with pytest.raises(ValueError, match=r"^sampler refusing does not take classifier-free guidance .* — "):
        Refusing(guidance_scale=2.0).check_fits(schedule, False, True)
    with pytest.raises(
        ValueError, match=r"^sampler refusing does not take a network with learned variances — "
    ):
        Refusing().check_fits(schedule, True, False)
    with pytest.raises(
        ValueError, match=r"^sampler refusing does not take a schedule with alpha_bar_T = 0 .* — "
    ):
        Refusing().check_fits(NoiseSchedule("cosine", num_timesteps=10, zero_terminal_snr=True), False, False)
    Refusing(guidance_scale=2.0).check_fits(
        schedule, False, False
    )  # guidance of an unconditional model: unused


@pytest.mark.parametrize("sampler", [None, "dpmpp_2m_sde", "ddpm"])
def test_an_option_of_other_samplers_out_of_every_range_is_refused_whatever_the_sampler(sampler):
    # A checkpoint stored eta 2 with dpmpp_2m_sde, and a later `sample --sampler ddim` failed on it (J7).
    with pytest.raises(ValueError, match=r"^eta=2 must be in \[0, 1\] — "):
        SamplingOptions(sampler=sampler, eta=2)
    SamplingOptions(sampler=sampler, eta=0.5)  # in the range of the samplers that take it: kept, unused here


@pytest.fixture(scope="module")
def zero_snr():
    """The tiny model as the optimal v-prediction on a zero-terminal-SNR schedule (alpha_bar_T = 0)."""
    return tiny_module(perturbation=0.0, zero_terminal_snr=True)


@pytest.mark.parametrize("name", NAMES)
def test_at_zero_terminal_snr_a_sampler_starts_from_pure_noise_and_samples_the_data_or_refuses(
    name, zero_snr
):
    x_T, noise = zero_snr.initial_noise(2000, seed=0)
    if not SAMPLERS[name].takes_zero_terminal_snr:
        with pytest.raises(
            ValueError, match=rf"^sampler {name} does not take a schedule with alpha_bar_T = 0 "
        ):
            zero_snr.sampler(options(name))
        return
    first = next(zero_snr.trajectory(x_T, noise, options(name, 100, clip_denoised=False)))
    # At T - 1, x_T is the noise itself: the optimal x_0 is the data's mean, whatever x_T is.
    assert first.t == T - 1
    torch.testing.assert_close(first.x0.flatten(1), zero_snr.network.means[-1].float().expand(2000, 4))
    # Over 10 seeds the distance to the data at 2 steps was >= 0.80 for every sampler, and at 100 steps <= 0.0048
    # (euler_ancestral: DDIM's eta-1 variance, too small on few steps): the bounds keep a margin of 3.
    data = (zero_snr.network.means[-1], torch.diag(STD**2))
    distances = {}
    for steps in (2, 100):
        samples = zero_snr.sample(2000, seed=0, options=options(name, steps, clip_denoised=False))
        assert samples.isfinite().all()
        distances[steps] = frechet_distance(gaussian_fit(samples), data)
    assert distances[2] > 0.3 and distances[100] < 0.015, distances


# ---- network evaluations, compiled ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_a_sample_costs_the_network_evaluations_the_sampler_says(name):
    module, calls = tiny_module(), []
    module.network.register_forward_hook(lambda *_: calls.append(1))
    module.sample(
        3, seed=0, options=options(name, 5, **guided(name)), labels=LABELS
    )  # a guided step: one call
    assert len(calls) == SAMPLERS[name].evaluations(5)


@pytest.mark.parametrize("name", NAMES)
def test_compiled_a_sampler_draws_the_eager_samples_from_one_graph(name, graphs_handed_to_the_backend):
    module, more = tiny_module(), guided(name)
    eager = module.sample(6, seed=3, options=options(name, **more), labels=LABELS.repeat(2))
    compiled = [
        module.sample(3, seed=3, indices=indices, options=options(name, compile=True, **more), labels=LABELS)
        for indices in (torch.arange(3), torch.arange(3, 6))
    ]  # two batches of one size: one graph for every step of both
    torch.testing.assert_close(torch.cat(compiled), eager, rtol=0, atol=1e-6)
    assert len(graphs_handed_to_the_backend) == 1


# ---- golden values ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_golden_values_of_the_code_before_the_contract(name):
    if name not in GOLDEN:  # a new sampler: its values as first written, so that later changes show
        pytest.fail(f"no golden values for {name}: add the samples GOLDEN's comment describes, computed once")
    golden = {key: torch.tensor(value).view(3, 1, 2, 2) for key, value in GOLDEN[name].items()}
    module = tiny_module()
    torch.testing.assert_close(
        module.sample(3, seed=11, options=options(name, 5)), golden["plain"], rtol=0, atol=1e-5
    )
    if SAMPLERS[name].takes_guidance:
        guided_sample = module.sample(3, seed=11, options=options(name, 5, **guided(name)), labels=LABELS)
        torch.testing.assert_close(guided_sample, golden["guided"], rtol=0, atol=1e-5)
    learned = tiny_module(learned_variance=True)
    if SAMPLERS[name].takes_learned_variance and learned.sampler(options(name, 5)).uses_learned_variance:
        torch.testing.assert_close(learned.sample(3, seed=11, options=options(name, 5)), golden["learned"], rtol=0,
                                   atol=1e-5)  # fmt: skip


if __name__ == "__main__":
    draw_on_two_processes(Path(sys.argv[1]))


def test_a_models_sampler_is_its_layers_of_options_built_once(monkeypatch):
    # The user's options over the checkpoint's over the learned variance's default: merged, then one sampler made
    # (its checks run once), not one per layer.
    module = tiny_module(learned_variance=True)
    module.sampling = SamplingOptions(sampler="ddpm", steps=7, clip_denoised=True)
    asked = SamplingOptions(clip_denoised=False)  # checked as it is made, before the model is known
    built = []
    checks = Sampler.__post_init__
    monkeypatch.setattr(Sampler, "__post_init__", lambda self: (built.append(type(self)), checks(self))[1])
    sampler = module.sampler(asked)
    assert built == [DDPM]
    assert (sampler.steps, sampler.clip_denoised, sampler.variance) == (7, False, "learned_range")
