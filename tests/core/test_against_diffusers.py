"""The samplers diffusers also has give diffusers' samples: for the same network (the tiny model of
tests/helpers/tiny_sampler.py), schedule (this project's `NoiseSchedule`, linear and cosine), timesteps and noise,
each registered sampler and its diffusers scheduler, driven by hand (``set_timesteps``, then ``scale_model_input``
and ``step`` with a torch.Generator), end within float32 rounding of each other. Where the two differ by design, a
test names the difference and checks that it is the one this project's docs and docstrings describe.

The settings that match (diffusers' defaults differ):
- timesteps: `uniform` is diffusers' ``timestep_spacing="linspace"`` (T - 1 and 0 both visited; T = 1000 and 10
  steps give integers, 111 apart), `trailing` is ``"trailing"``; the `log_snr` and `karras` grids, and any grid
  of the DPM-Solver++ samplers, go to diffusers as custom timesteps (``set_timesteps(timesteps=...)``), to
  EulerAncestralDiscreteScheduler (which takes none) as its ``timesteps`` and ``sigmas``.
- noise: x_T drawn once and given to both; every later draw from one torch.Generator per side, seeded alike. Both
  draw ``torch.randn`` of the sample's shape in the same order; diffusers draws once more at its last step (DDIM
  with eta > 0, the SDE solver, Euler ancestral), where the noise is multiplied by 0, after every draw of ours.
- clipping x_0 to [-1, 1] (`clip_denoised`): DDPM's, DDIM's and Heun's ``clip_sample``; DPM-Solver's
  ``thresholding`` with ``sample_max_value=1`` (the threshold s is clamped to [1, 1]: plain clipping); Euler
  ancestral has none, so it runs unclipped. DDIM with ``use_clipped_model_output=True``: eps recomputed from the
  clipped x_0, as this project's `Denoiser` does (`test_diffusers_ddim_keeps_the_unclipped_eps_by_default`).
- the sigma-form schedulers (Euler ancestral, Heun) step x~ = x_t / sqrt(abar_t): they start from
  x~_T = sqrt(1 + sigma_{T-1}^2) x_T, this project's x_T in their variable (`test_diffusers_starts_...`).
- the schedule: diffusers is given this project's betas (``trained_betas``). By name it would need Ho et al.'s
  beta_start and beta_end spelled out: HeunDiscreteScheduler's defaults are Stable Diffusion's 0.00085 and 0.012.

Measured differences, as a fraction of the sample's scale (max(1, max |x|)): at most 3.2e-6 on the linear schedule
and 1.4e-5 on the cosine, whose eps-predictions at T - 1 (sigma 2e4) blow an unclipped x_0 up to 10..800; one case
more (Heun on the cosine, 7.7e-4) is diffusers' float32 (`test_diffusers_heun_loses_digits_in_float32_...`).
"""

import inspect
import math

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    HeunDiscreteScheduler,
)
from helpers.tiny_sampler import T, TinyNetwork, _one_thread  # noqa: F401 (_one_thread: autouse)

from diffusion.core.samplers.spacing import LOWEST_GRID_LAMBDA, half_log_snr, sigmas, uniform_timesteps
from diffusion.core.sampling import SamplingOptions, build_sampler, final_sample, reverse_steps
from diffusion.core.schedule import NoiseSchedule

STEPS = 10
SHAPE = (8, 1, 2, 2)  # 8 samples of the tiny model's (1, 2, 2)
NOISE_SEED = 5
# Float32 rounding over a few steps, times the sample's scale (measured <= 1.4e-5: the module's docstring).
TOLERANCE = 3e-5
SCHEDULES = ["linear", "cosine"]

NETWORK = TinyNetwork()  # eps of Gaussian data plus a seeded perturbation: a deterministic function of (x, t)


def x_T() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))


def scheduler(kind: type, schedule: NoiseSchedule, **config):
    """diffusers' `kind` on this project's schedule (its betas)."""
    return kind(num_train_timesteps=T, trained_betas=schedule.betas.tolist(), **config)


def training_timestep(t: torch.Tensor, batch: int) -> torch.Tensor:
    """A diffusers timestep (int64, or float for the sigma-form schedulers) as the network's (B,) int64."""
    assert float(t) == round(float(t)), f"diffusers asks the network at t = {float(t)}: not a training one"
    return torch.full((batch,), round(float(t)), dtype=torch.long)


def diffusers_sample(made, x_T: torch.Tensor, dtype: torch.dtype = torch.float32, **step_kwargs):
    """diffusers' loop (as its pipelines run it) from this project's x_T, the step noise from NOISE_SEED; the
    scheduler's arithmetic in `dtype` (the network's in float32)."""
    sigma_form = made.init_noise_sigma != 1
    x = x_T.to(dtype)
    if sigma_form:  # x~_T: see the module's docstring
        x = x * math.sqrt(1 + made.sigmas.max().item() ** 2)
    if "generator" in inspect.signature(made.step).parameters:  # Heun draws no noise
        step_kwargs["generator"] = torch.Generator().manual_seed(NOISE_SEED)
    for t in made.timesteps:
        output = NETWORK(made.scale_model_input(x, t).float(), training_timestep(t, len(x)))
        x = made.step(output.to(dtype), t, x, **step_kwargs).prev_sample
    return x.float()  # sigma_0 = 0: x~ is x


def our_sample(schedule: NoiseSchedule, x_T: torch.Tensor, **options) -> torch.Tensor:
    """This project's sample from x_T, the step noise from NOISE_SEED; `steps` STEPS unless given."""
    generator = torch.Generator().manual_seed(NOISE_SEED)
    options = {"steps": STEPS, **options}
    return final_sample(reverse_steps(NETWORK, schedule, x_T, generator=generator, **options))


def our_timesteps(schedule: NoiseSchedule, **options) -> list[int]:
    """The training timesteps a sampler visits, in the order it visits them (descending)."""
    return build_sampler(SamplingOptions(**{"steps": STEPS, **options})).timesteps(schedule).flip(0).tolist()


def visited(made) -> list[int]:
    """The timesteps a diffusers scheduler visits (Heun's second evaluations repeat them: once each)."""
    return [round(float(t)) for t in dict.fromkeys(made.timesteps.tolist())]


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float = TOLERANCE) -> None:
    scale = max(1.0, theirs.abs().max().item())
    difference = (ours - theirs).abs().max().item()
    assert difference <= tolerance * scale, f"max difference {difference:.3g}, sample scale {scale:.3g}"


# id: (our options, diffusers' scheduler, its config, its timesteps: "ours" (custom) or its spacing's, step kwargs).
# 7 steps: trailing timesteps 1000 / 7 = 142.9 apart, rounded (DDIMScheduler steps by T // S: 10 steps only).
CASES = {
    "ddpm_fixedlarge": ({"sampler": "ddpm", "variance": "fixedlarge"},
                        DDPMScheduler, {"variance_type": "fixed_large", "timestep_spacing": "linspace"}, None, {}),
    "ddpm_fixedsmall_unclipped": ({"sampler": "ddpm", "variance": "fixedsmall", "clip_denoised": False},
                                  DDPMScheduler, {"variance_type": "fixed_small", "clip_sample": False,
                                                  "timestep_spacing": "linspace"}, None, {}),
    "ddpm_fixedsmall_trailing": ({"sampler": "ddpm", "variance": "fixedsmall", "spacing": "trailing", "steps": 7},
                                 DDPMScheduler, {"variance_type": "fixed_small", "timestep_spacing": "trailing"},
                                 None, {}),
    "ddim_eta0_trailing": ({"sampler": "ddim", "eta": 0.0, "spacing": "trailing"},
                           DDIMScheduler, {"timestep_spacing": "trailing"}, None,
                           {"eta": 0.0, "use_clipped_model_output": True}),
    "ddim_eta0.5_trailing_unclipped": ({"sampler": "ddim", "eta": 0.5, "spacing": "trailing", "clip_denoised": False},
                                       DDIMScheduler, {"timestep_spacing": "trailing", "clip_sample": False}, None,
                                       {"eta": 0.5}),
    "ddim_eta1_trailing": ({"sampler": "ddim", "eta": 1.0, "spacing": "trailing"},
                           DDIMScheduler, {"timestep_spacing": "trailing"}, None,
                           {"eta": 1.0, "use_clipped_model_output": True}),
    "dpmpp_2m_log_snr": ({"sampler": "dpmpp_2m"}, DPMSolverMultistepScheduler,
                         {"algorithm_type": "dpmsolver++", "thresholding": True, "sample_max_value": 1.0}, "ours", {}),
    "dpmpp_2m_trailing_unclipped": ({"sampler": "dpmpp_2m", "spacing": "trailing", "clip_denoised": False,
                                     "steps": 7},
                                    DPMSolverMultistepScheduler,
                                    {"algorithm_type": "dpmsolver++", "timestep_spacing": "trailing"}, None, {}),
    "dpmpp_2m_sde_log_snr": ({"sampler": "dpmpp_2m_sde"}, DPMSolverMultistepScheduler,
                             {"algorithm_type": "sde-dpmsolver++", "thresholding": True, "sample_max_value": 1.0},
                             "ours", {}),
    "dpmpp_2m_sde_uniform_unclipped": ({"sampler": "dpmpp_2m_sde", "spacing": "uniform", "clip_denoised": False},
                                       DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++"}, "ours", {}),
    "euler_ancestral_uniform": ({"sampler": "euler_ancestral", "spacing": "uniform", "clip_denoised": False},
                                EulerAncestralDiscreteScheduler, {"timestep_spacing": "linspace"}, None, {}),
    "euler_ancestral_trailing": ({"sampler": "euler_ancestral", "spacing": "trailing", "clip_denoised": False,
                                  "steps": 7},
                                 EulerAncestralDiscreteScheduler, {"timestep_spacing": "trailing"}, None, {}),
    "euler_ancestral_karras": ({"sampler": "euler_ancestral", "clip_denoised": False},
                               EulerAncestralDiscreteScheduler, {}, "ours", {}),
    "heun_karras": ({"sampler": "heun"}, HeunDiscreteScheduler, {"clip_sample": True}, "ours", {}),
    "heun_karras_unclipped": ({"sampler": "heun", "clip_denoised": False}, HeunDiscreteScheduler, {}, "ours", {}),
}  # fmt: skip


def set_timesteps(made, steps: int, timesteps: list[int] | None) -> None:
    """`timesteps` (descending) as custom timesteps, or `steps` of the scheduler's own spacing when None."""
    if timesteps is None:
        made.set_timesteps(steps)
    elif isinstance(made, EulerAncestralDiscreteScheduler):  # no custom timesteps: set what they would set
        made.set_timesteps(steps)
        grid = sigmas(made.alphas_cumprod)[timesteps]
        made.timesteps = torch.tensor(timesteps, dtype=torch.float32)
        made.sigmas = torch.cat([grid, torch.zeros(1, dtype=grid.dtype)]).float()
    else:
        made.set_timesteps(timesteps=timesteps)


# Where diffusers' float32 loses more (measured 7.7e-4): test_diffusers_heun_loses_digits_in_float32_...
DIFFUSERS_FLOAT32_LOSS = {("heun_karras", "cosine"): 2e-3}


@pytest.mark.parametrize("beta_schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_the_sampler_gives_the_diffusers_schedulers_samples(case, beta_schedule):
    ours, kind, config, timesteps, step_kwargs = CASES[case]
    schedule = NoiseSchedule(beta_schedule, T)
    visits = our_timesteps(schedule, **ours)
    made = scheduler(kind, schedule, **config)
    set_timesteps(made, len(visits), visits if timesteps == "ours" else None)
    assert visited(made) == visits  # the same timesteps: then the same noise levels, as the table is the same
    theirs = diffusers_sample(made, x_T(), **step_kwargs)
    tolerance = DIFFUSERS_FLOAT32_LOSS.get((case, beta_schedule), TOLERANCE)
    assert_same(our_sample(schedule, x_T(), **ours), theirs, tolerance)
    assert theirs.std(0).min() > 0.01  # samples, not one point: the noise reached both


def test_diffusers_heun_loses_digits_in_float32_at_the_cosines_largest_sigma():
    """The cosine schedule's sigma_{T-1} is 2e4 (its last beta clipped at 0.999). diffusers' Heun forms Euler's
    predictor as x~ + (sigma' - sigma) d with x~ ~ 2e4, where float32 keeps 2e-3, and its correction multiplies
    that error by about sigma / (2 sigma') = 110: on the way to sigma' = 92 its samples move by ~1e-3. This
    project's Heun forms the predictor as sqrt(abar') (D + sigma' eps) (karras.py, step 2) and keeps float32's
    digits: it agrees with diffusers' step run in float64 on the same (float64) sigmas, to the comparisons'
    tolerance."""
    schedule = NoiseSchedule("cosine", T)
    visits = our_timesteps(schedule, sampler="heun")
    ours = our_sample(schedule, x_T(), sampler="heun")
    made = scheduler(HeunDiscreteScheduler, schedule, clip_sample=True)
    made.set_timesteps(timesteps=visits)
    assert 1e-4 < (diffusers_sample(made, x_T()) - ours).abs().max() < 2e-3
    made.set_timesteps(timesteps=visits)
    grid = sigmas(schedule.alphas_cumprod)[visits]  # (S,) float64, descending
    made.sigmas = torch.cat([grid[:1], grid[1:].repeat_interleave(2), grid.new_zeros(1)])  # Heun's layout
    assert_same(ours, diffusers_sample(made, x_T(), dtype=torch.float64))


def test_diffusers_ddpm_adds_noise_on_its_last_step_when_that_step_is_not_from_t_0():
    """Ho et al.'s Algorithm 2 adds no noise on the last step (z = 0 when t = 1; ddpm_ddim.py's step 5), nor does
    this project's DDPM, wherever the last step starts. DDPMScheduler skips the noise only at t = 0: with
    `trailing` (last step from T/S - 1 = 99 to the data) and fixed_large, its sample is ours plus
    sqrt(beta) z, beta = 1 - alpha_bar_99 the step's variance and z its next draw."""
    schedule = NoiseSchedule("linear", T)
    made = scheduler(DDPMScheduler, schedule, variance_type="fixed_large", timestep_spacing="trailing")
    made.set_timesteps(STEPS)
    last = visited(made)[-1]
    assert last == T // STEPS - 1
    theirs = diffusers_sample(made, x_T())
    ours = our_sample(schedule, x_T(), sampler="ddpm", variance="fixedlarge", spacing="trailing")
    replay = torch.Generator().manual_seed(NOISE_SEED)
    for _ in range(STEPS - 1):  # our draws, one a step but the last
        torch.randn(SHAPE, generator=replay)
    extra = (1 - schedule.alphas_cumprod[last]).sqrt() * torch.randn(SHAPE, generator=replay)
    assert extra.abs().max() > 0.3  # a difference no tolerance hides
    assert_same(ours + extra, theirs)


def test_diffusers_ddim_steps_by_t_over_s_from_linspace_timesteps():
    """This project's DDIM steps from each timestep it visits to the next (ddpm_ddim.py: a loop over a
    subsequence of the training timesteps), `uniform` being 999, 888, ..., 111, 0 for 10 steps. DDIMScheduler's
    ``linspace`` visits the same timesteps but steps from each t to t - T // S = t - 100, and then evaluates the
    network at t - 111 on an x_t of the level t - 100. Stepping by 111 (num_inference_steps 9: 1000 // 9 = 111)
    gives our samples."""
    schedule = NoiseSchedule("linear", T)
    ours = our_sample(schedule, x_T(), sampler="ddim", eta=0.0)
    made = scheduler(DDIMScheduler, schedule, timestep_spacing="linspace")
    made.set_timesteps(STEPS)
    assert visited(made) == uniform_timesteps(T, STEPS).flip(0).tolist() == list(range(999, -1, -111))
    step = {"eta": 0.0, "use_clipped_model_output": True}
    theirs = diffusers_sample(made, x_T(), **step)
    assert (ours - theirs).abs().max() > 1e-2
    made.num_inference_steps = STEPS - 1  # the stride T // 9 = 111: each step to the next timestep visited
    assert_same(ours, diffusers_sample(made, x_T(), **step))


def test_diffusers_ddim_keeps_the_unclipped_eps_by_default():
    """This project's `Denoiser` recomputes eps from the clipped x_0 so the two stay consistent (contract.py);
    DDIMScheduler does so only with use_clipped_model_output=True (the comparisons above), by default (and as
    DDIMPipeline calls it) it keeps the network's eps beside the clipped x_0."""
    schedule = NoiseSchedule("linear", T)
    ours = our_sample(schedule, x_T(), sampler="ddim", eta=0.0, spacing="trailing")
    made = scheduler(DDIMScheduler, schedule, timestep_spacing="trailing")
    made.set_timesteps(STEPS)
    assert (ours - diffusers_sample(made, x_T(), eta=0.0)).abs().max() > 1e-2
    unclipped = scheduler(DDIMScheduler, schedule, timestep_spacing="trailing", clip_sample=False)
    unclipped.set_timesteps(STEPS)  # nothing clipped: the setting changes nothing
    assert_same(
        our_sample(schedule, x_T(), sampler="ddim", eta=0.0, spacing="trailing", clip_denoised=False),
        diffusers_sample(unclipped, x_T(), eta=0.0),
    )


def test_diffusers_starts_its_sigma_form_schedulers_from_sigma_max_z():
    """Every sampler here starts from x_T ~ N(0, I) at t = T - 1 (docs/training.md), x~_T = sqrt(1 + sigma^2) x_T
    in Karras et al.'s variable. diffusers' init_noise_sigma is sigma_{T-1} itself with linspace or trailing
    timesteps: x~_T = sigma z, i.e. x_T = sqrt(1 - alpha_bar_{T-1}) z, 2e-5 short of unit variance on the linear
    schedule. The comparisons start diffusers from this project's x_T."""
    schedule = NoiseSchedule("linear", T)
    sigma_max = sigmas(schedule.alphas_cumprod)[-1].item()
    for kind in (EulerAncestralDiscreteScheduler, HeunDiscreteScheduler):
        for spacing in ("linspace", "trailing"):
            made = scheduler(kind, schedule, timestep_spacing=spacing)
            made.set_timesteps(STEPS)
            assert made.init_noise_sigma.item() == pytest.approx(sigma_max, rel=1e-6)
            assert made.init_noise_sigma.item() != pytest.approx(math.hypot(1, sigma_max), rel=1e-6)


@pytest.mark.parametrize("steps_offset", [0, 1])
def test_diffusers_leading_timesteps_start_below_t_minus_1(steps_offset):
    """spacing.py: every spacing of this project starts at T - 1, the noise level x_T is drawn at. DDIMScheduler's
    default spacing, "leading", starts at (S - 1) T / S + steps_offset (901 with Stable Diffusion's offset 1), a
    level x_T ~ N(0, I) was not drawn for; no spacing here gives it."""
    schedule = NoiseSchedule("linear", T)
    made = scheduler(DDIMScheduler, schedule, steps_offset=steps_offset)
    made.set_timesteps(STEPS)
    assert visited(made)[0] == (STEPS - 1) * T // STEPS + steps_offset
    for spacing in ("uniform", "trailing", "log_snr", "karras"):
        assert our_timesteps(schedule, sampler="ddim", spacing=spacing)[0] == T - 1


@pytest.mark.parametrize(
    ("kind", "config", "sampler"),
    [(HeunDiscreteScheduler, {"use_karras_sigmas": True}, "heun"),
     (DPMSolverMultistepScheduler, {"use_karras_sigmas": True}, "dpmpp_2m"),
     (DPMSolverMultistepScheduler, {"use_lu_lambdas": True}, "dpmpp_2m")],
    ids=["heun_karras", "dpmpp_2m_karras", "dpmpp_2m_lu_lambdas"],
)  # fmt: skip
def test_continuous_grids_go_to_the_nearest_training_timestep_and_stop_at_sigma_164(kind, config, sampler):
    """docs/training.md: a continuous spacing goes to the training timestep nearest in log sigma and the steps use
    that timestep's own sigma (the network is never asked about a noise level it was not trained at), and the
    karras and log_snr grids stop at sigma = exp(5.1) = 164, starting at T - 1 all the same. diffusers' Karras
    sigmas (and DPM-Solver's Lu lambdas, its log-SNR grid) keep the grid's own sigmas, asking the network at a
    fractional t (Heun) or at the rounded one (DPM-Solver, which still steps with the grid's sigma), and run from
    sigma_{T-1} however large. With our timesteps given as custom ones the samples agree (the cases above)."""
    spacing = "log_snr" if config.get("use_lu_lambdas") else "karras"
    linear = NoiseSchedule("linear", T)
    made = scheduler(kind, linear, **config)
    made.set_timesteps(STEPS)
    grid = made.sigmas[made.sigmas > 0].unique().double().flip(0)  # descending, Heun's repeats once
    log_sigmas = -half_log_snr(linear.alphas_cumprod)  # (T,)
    nearest = [int((log_sigmas - s.log()).abs().argmin()) for s in grid]
    assert our_timesteps(linear, sampler=sampler, spacing=spacing) == nearest  # sigma_{T-1} = 157: no cap
    training = sigmas(linear.alphas_cumprod)
    assert (grid / training[nearest] - 1).abs().max() > 1e-3  # diffusers' sigmas are not the training ones
    if kind is HeunDiscreteScheduler:
        assert any(float(t) != round(float(t)) for t in made.timesteps)

    cosine = NoiseSchedule("cosine", T)
    made = scheduler(kind, cosine, **config)
    made.set_timesteps(STEPS)
    ours = our_timesteps(cosine, sampler=sampler, spacing=spacing)
    cosine_sigmas = sigmas(cosine.alphas_cumprod)
    assert ours[0] == T - 1 and cosine_sigmas[T - 1] > 1e4
    assert (cosine_sigmas[ours[1:]] <= math.exp(-LOWEST_GRID_LAMBDA)).all()
    assert made.sigmas[1] > 1e3  # diffusers' second sigma: x_t is noise to many digits there


def test_diffusers_dpm_solver_linspace_steps_from_t_over_s_to_the_data():
    """The DPM-Solver++ samplers' `uniform` grid runs from T - 1 down to t = 0 and then to the data (dpm_solver.py:
    the last step returns the predicted x_0 at t = 0, the reference code's denoise_to_zero). DPMSolverMultistep-
    Scheduler's linspace of S steps is the uniform grid of S + 1 without t = 0: its last step goes from t = 100
    (T / S) to the data. Given our timesteps, it samples as ours (the cases above)."""
    schedule = NoiseSchedule("linear", T)
    made = scheduler(DPMSolverMultistepScheduler, schedule, algorithm_type="dpmsolver++")
    made.set_timesteps(STEPS)
    assert our_timesteps(schedule, sampler="dpmpp_2m", spacing="uniform")[-1] == 0
    assert visited(made) == uniform_timesteps(T, STEPS + 1).flip(0).tolist()[:-1]
    assert visited(made)[-1] == T // STEPS
