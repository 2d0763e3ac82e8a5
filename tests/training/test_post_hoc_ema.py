"""Post-hoc EMA (Karras et al. 2024, EDM2): the power-function math against references written here in float64,
and the profiles and snapshots the EMA callback keeps during tiny toy-2D fits.

- The solver: its coefficients against a float64 reference that samples the profiles on a fine grid and solves
  the constrained least squares by elimination with `torch.linalg.lstsq`; a snapshot's own profile is
  reconstructed by that snapshot alone.
- The callback: its profiles equal a hand-tracked power-function EMA of the raw weights after every optimizer
  step (under gradient accumulation: per optimizer step, not per micro-batch); reconstructing a tracked sigma_rel
  gives that profile's snapshot; reconstructing another one matches an EMA of that sigma_rel tracked directly
  to within 1% of the distance between the two tracked profiles (`TRACKED_TOLERANCE`); with parameters in
  bfloat16 the profiles still average in float32.
Exact resume and DDP: tests/training/test_post_hoc_ema_runs.py; the command: tests/cli/test_phema.py.
"""

import logging
import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from diffusion.data.vectors import VectorDataModule
from diffusion.errors import UserError
from diffusion.models import MLP
from diffusion.training.callbacks import EMA
from diffusion.training.ema_profiles import (
    MAX_SIGMA_REL,
    gamma_of,
    sigma_rel_of,
    solve,
    step_weights,
    update_weight,
)
from diffusion.training.module import DiffusionModule
from diffusion.training.post_hoc_ema import PostHocEMA, find_snapshots, read_weights, reconstruct

SIGMA_RELS = (0.05, 0.10)
# A reconstruction of an untracked sigma_rel differs from that EMA tracked directly by at most this fraction of
# the largest difference between the two tracked profiles' weights (measured: 0.1% at 0.07, 0.2% at 0.15;
# outside the tracked range it grows: 1.2% at 0.03, 3% at 0.2).
TRACKED_TOLERANCE = 0.01


# ---- the math ------------------------------------------------------------------------------------------
def test_sigma_rel_and_gamma_invert_each_other_with_edm2s_values():
    assert gamma_of(0.05) == pytest.approx(16.97, abs=0.01)  # EDM2 Sec. 3.1
    assert gamma_of(0.10) == pytest.approx(6.94, abs=0.01)
    for sigma_rel in (0.001, 0.05, 0.1, 0.2, 0.28):
        gamma = gamma_of(sigma_rel)
        # Eq. 123 by hand: the relative standard deviation of (gamma + 1) tau^gamma on [0, 1].
        mean, square = (gamma + 1) / (gamma + 2), (gamma + 1) / (gamma + 3)
        assert math.sqrt(square - mean**2) == pytest.approx(sigma_rel, rel=1e-10)
        assert sigma_rel_of(gamma) == pytest.approx(sigma_rel, rel=1e-12)
    assert gamma_of(MAX_SIGMA_REL) == pytest.approx(0.0, abs=1e-9)  # a plain running mean
    for bad in (0.0, -0.1, 0.3):
        with pytest.raises(ValueError, match="out of range"):
            gamma_of(bad)


@pytest.mark.parametrize("sigma_rel", [0.05, 0.25])
def test_the_tracked_update_weighs_each_step_by_the_profiles_mass_over_it(sigma_rel):
    """The update applied to one-hot "weights" (step tau's are e_tau) leaves, in the average, the weight of each
    step: the density (gamma + 1) tau^gamma / t^(gamma + 1) integrated over (tau - 1, tau]."""
    gamma, steps = gamma_of(sigma_rel), 40
    average = torch.zeros(steps, dtype=torch.float64)
    for t in range(1, steps + 1):
        average.lerp_(torch.eye(steps, dtype=torch.float64)[t - 1], update_weight(gamma, t))
    mass = torch.stack([  # the density integrated over each step's interval, numerically
        torch.trapezoid((gamma + 1) * x**gamma / steps ** (gamma + 1), x)
        for x in (torch.linspace(tau - 1, tau, 2001, dtype=torch.float64) for tau in range(1, steps + 1))
    ])  # fmt: skip
    torch.testing.assert_close(average, step_weights(steps, gamma), atol=1e-15, rtol=0)
    torch.testing.assert_close(average, mass, atol=1e-7, rtol=1e-6)
    assert average.sum().item() == pytest.approx(1.0, abs=1e-14)


def reference_coefficients(
    steps, gammas, target_step, target_gamma, points=200_000
) -> tuple[torch.Tensor, float]:
    """Float64: every profile sampled at the midpoints of `points` equal cells of (0, target_step] (the snapshot
    steps lie on cell boundaries), the constraint sum x = 1 eliminated as x_last = 1 - sum(others), the rest
    solved by least squares. Returns the coefficients and the relative L2 error of the combined profile."""
    cell = target_step / points
    tau = (torch.arange(points, dtype=torch.float64) + 0.5) * cell  # (P,)

    def profile(t: float, gamma: float) -> torch.Tensor:
        return torch.where(tau <= t, (gamma + 1) * tau**gamma / t ** (gamma + 1), 0.0)

    basis = torch.stack([profile(t, g) for t, g in zip(steps, gammas, strict=True)], dim=1)  # (P, K)
    target = profile(target_step, target_gamma)
    design = (basis[:, :-1] - basis[:, -1:]) * math.sqrt(cell)
    rhs = ((target - basis[:, -1]) * math.sqrt(cell))[:, None]
    others = torch.linalg.lstsq(design, rhs, driver="gelsd").solution[:, 0]
    x = torch.cat([others, 1 - others.sum(dim=0, keepdim=True)])
    return x, float((basis @ x - target).norm() / target.norm())


@pytest.mark.parametrize("target", [(1000, 0.07), (1000, 0.15), (1000, 0.03), (700, 0.08)])
def test_the_solution_is_the_least_squares_average_of_a_float64_reference(target):
    target_step, sigma_rel = target
    steps = [s for s in (400, 700, 1000) if s <= target_step] * 2
    gammas = [gamma_of(0.05)] * (len(steps) // 2) + [gamma_of(0.10)] * (len(steps) // 2)
    solution = solve(steps, gammas, target_step, gamma_of(sigma_rel))
    expected, error = reference_coefficients(steps, gammas, target_step, gamma_of(sigma_rel))
    torch.testing.assert_close(solution.coefficients, expected, atol=1e-6, rtol=0)
    assert solution.relative_error == pytest.approx(error, rel=1e-4, abs=1e-7)
    assert solution.coefficients.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_a_snapshots_own_profile_is_reconstructed_by_that_snapshot_alone():
    steps = [100 * i for i in range(1, 25)] * 2
    gammas = [gamma_of(0.05)] * 24 + [gamma_of(0.10)] * 24
    for k in (23, 47, 10, 30):
        used = [i for i, step in enumerate(steps) if step <= steps[k]]
        solution = solve([steps[i] for i in used], [gammas[i] for i in used], steps[k], gammas[k])
        expected = torch.zeros(len(used), dtype=torch.float64)
        expected[used.index(k)] = 1.0
        torch.testing.assert_close(solution.coefficients, expected, atol=1e-9, rtol=0)
        assert solution.relative_error < 1e-6


# ---- the callback in a fit ------------------------------------------------------------------------------
class Recorder(L.Callback):
    """The parameters after every optimizer step, and the post-hoc step count after every micro-batch."""

    def __init__(self, ema: EMA) -> None:
        self.ema = ema
        self.raw_after_step: list[dict[str, torch.Tensor]] = []
        self.steps_after_batch: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # After EMA's own on_train_batch_end (callbacks run in list order).
        if trainer.global_step > len(self.raw_after_step):
            self.raw_after_step.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})
        self.steps_after_batch.append(self.ema.post_hoc.step)


def fit(root, max_steps: int, snapshot_every: int, accumulate: int = 1, sigma_rels=SIGMA_RELS):
    L.seed_everything(0)
    data = VectorDataModule("swiss_roll", num_samples=256, batch_size=32)
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8)
    module = DiffusionModule(
        network, sample_shape=(2,), normalization=data.normalization, num_timesteps=100, lr=3e-2,
        warmup_steps=1, noise_mode="per_sample", noise_seed=0,
    )  # fmt: skip
    ema = EMA(decay=0.9, post_hoc=True, sigma_rels=sigma_rels, snapshot_every=snapshot_every)
    recorder = Recorder(ema)
    trainer = L.Trainer(
        max_steps=max_steps, accumulate_grad_batches=accumulate, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
        accelerator="cpu", devices=1, callbacks=[ema, recorder],
    )  # fmt: skip
    trainer.fit(module, data)
    return ema, recorder


def hand_power_ema(
    raw_after_step: list[dict[str, torch.Tensor]], sigma_rel: float
) -> dict[str, torch.Tensor]:
    """EDM2 Eq. 127 in float64: beta_t = (1 - 1/t)^(gamma + 1) at optimizer step t, the first step copied."""
    gamma = gamma_of(sigma_rel)
    average = {name: value.double() for name, value in raw_after_step[0].items()}
    for t, raw in enumerate(raw_after_step[1:], start=2):
        beta = (1 - 1 / t) ** (gamma + 1)
        average = {name: beta * average[name] + (1 - beta) * raw[name].double() for name in average}
    return average


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def accumulating(tmp_path_factory):
    """6 optimizer steps of 2 micro-batches each, a snapshot every 4 steps (and at the last, 6)."""
    root = tmp_path_factory.mktemp("accumulating")
    ema, recorder = fit(root, max_steps=6, snapshot_every=4, accumulate=2)
    return root, ema, recorder


def test_the_profiles_are_power_function_emas_updated_once_per_optimizer_step(accumulating):
    root, ema, recorder = accumulating
    assert recorder.steps_after_batch == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]  # 12 micro-batches, 6 steps
    assert len(recorder.raw_after_step) == 6
    for sigma_rel, profile in zip(SIGMA_RELS, ema.post_hoc.profiles, strict=True):
        expected = hand_power_ema(recorder.raw_after_step, sigma_rel)
        assert max_difference(profile, expected) < 1e-6
        assert max_difference(profile, recorder.raw_after_step[-1]) > 1e-3  # an average, not the last weights
    snapshots = find_snapshots(root / "post_hoc_ema")
    assert [(s.step, s.sigma_rel) for s in snapshots] == [(4, 0.05), (4, 0.1), (6, 0.05), (6, 0.1)]
    for snapshot in snapshots:
        assert snapshot.path.name == f"step={snapshot.step:09d}-sigma_rel={snapshot.sigma_rel:g}.pt"
        contents = torch.load(snapshot.path, weights_only=True)  # plain tensors and numbers
        expected = hand_power_ema(recorder.raw_after_step[: snapshot.step], snapshot.sigma_rel)
        assert max_difference(contents["weights"], expected) < 1e-6
        assert all(v.dtype == torch.float32 for v in contents["weights"].values())


def test_reconstructing_a_tracked_sigma_rel_gives_that_profiles_snapshot(accumulating):
    root, _, _ = accumulating
    snapshots = find_snapshots(root / "post_hoc_ema")
    for step in (4, 6):
        for snapshot in [s for s in snapshots if s.step == step]:
            reconstruction = reconstruct(snapshots, snapshot.sigma_rel, step)
            assert len(reconstruction.snapshots) == (2 if step == 4 else 4)
            assert max_difference(reconstruction.weights, read_weights(snapshot)) < 1e-7


@pytest.fixture(scope="module")
def longer(tmp_path_factory):
    """60 optimizer steps, a snapshot every 5: 12 per profile."""
    root = tmp_path_factory.mktemp("longer")
    ema, recorder = fit(root, max_steps=60, snapshot_every=5)
    return root, ema, recorder


@pytest.mark.parametrize("sigma_rel", [0.07, 0.15])
def test_a_reconstructed_ema_matches_that_ema_tracked_directly(longer, sigma_rel):
    root, ema, recorder = longer
    tracked = hand_power_ema(recorder.raw_after_step, sigma_rel)
    reconstruction = reconstruct(find_snapshots(root / "post_hoc_ema"), sigma_rel)
    assert reconstruction.step == 60 and len(reconstruction.snapshots) == 24
    spread = max_difference(*ema.post_hoc.profiles)  # how far apart the two tracked profiles are
    assert spread > 1e-3
    assert max_difference(reconstruction.weights, tracked) <= TRACKED_TOLERANCE * spread
    assert reconstruction.solution.relative_error < 0.02  # 0.7% at 0.07, 1.6% at 0.15: 12 snapshots each


# ---- the callback's pieces ------------------------------------------------------------------------------
def tiny_module(dtype: torch.dtype = torch.float32) -> DiffusionModule:
    torch.manual_seed(0)
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8)
    return DiffusionModule(network, sample_shape=(2,), beta_schedule="cosine", num_timesteps=10).to(dtype)


def fake_trainer(tmp_path, max_steps: int = 20) -> SimpleNamespace:
    # No logger: the run folder is default_root_dir (run_folders.run_folder), broadcast by a one-process strategy.
    return SimpleNamespace(
        loggers=[], default_root_dir=str(tmp_path), strategy=SimpleNamespace(broadcast=lambda value: value),
        is_global_zero=True, max_steps=max_steps, global_step=0,
    )  # fmt: skip


def test_with_bfloat16_parameters_the_profiles_average_in_float32(tmp_path):
    module = tiny_module(torch.bfloat16)
    post_hoc = PostHocEMA(SIGMA_RELS, snapshot_every=100, max_snapshot_gb=1.0)
    post_hoc.setup(fake_trainer(tmp_path), module)
    raw = []
    for step in range(1, 5):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p) * step)
        raw.append({n: p.detach().clone() for n, p in module.named_parameters()})
        post_hoc.update(step)
    for sigma_rel, profile in zip(SIGMA_RELS, post_hoc.profiles, strict=True):
        assert all(value.dtype == torch.float32 for value in profile.values())
        # bfloat16 rounding of the average would be ~1e-2 here; float32's is ~1e-6.
        assert max_difference(profile, hand_power_ema(raw, sigma_rel)) < 1e-5


def test_the_budget_widens_the_interval_and_refuses_less_than_one_snapshot_of_each(tmp_path, caplog):
    module = tiny_module()
    instant = 2 * sum(p.numel() for p in module.parameters()) * 4  # two profiles in float32
    budget = 3.5 * instant / 1e9  # holds 3 snapshot instants
    post_hoc = PostHocEMA(SIGMA_RELS, snapshot_every=2, max_snapshot_gb=budget)
    trainer = fake_trainer(tmp_path, max_steps=20)
    post_hoc.setup(trainer, module)
    with caplog.at_level(logging.INFO):
        post_hoc.on_train_start(trainer)
    assert post_hoc.interval == 8  # every 2 would be 10 instants; every 8: steps 8, 16 and the last, 20
    assert "a snapshot of each every 8 steps (every 2 would take" in caplog.text
    assert "6 files" in caplog.text and str(tmp_path / "post_hoc_ema") in caplog.text
    with pytest.raises(UserError, match=r"^max_snapshot_gb .* cannot hold one post-hoc EMA snapshot of each"):
        PostHocEMA(SIGMA_RELS, snapshot_every=2, max_snapshot_gb=0.9 * instant / 1e9).setup(trainer, module)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sigma_rels": ()}, "sigma_rels is empty"),
        ({"sigma_rels": (0.05, 0.4)}, "sigma_rel=0.4 is out of range"),
        ({"sigma_rels": (0.05, 0.05)}, "repeats a value"),
        ({"snapshot_every": 0}, "snapshot_every=0 must be a whole number >= 1"),
        # a fraction was stored as given (PostHocEMA's interval 2.5)
        ({"snapshot_every": 2.5}, "snapshot_every=2.5 must be a whole number >= 1"),
        ({"max_snapshot_gb": 0.0}, "max_snapshot_gb=0.0 must be > 0"),
    ],
)
def test_bad_post_hoc_options_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EMA(post_hoc=True, **kwargs)


def test_a_fractional_snapshot_interval_is_refused_by_post_hoc_ema_itself():
    with pytest.raises(
        ValueError, match=r"^ema.snapshot_every=2.5 must be a whole number >= 1 — pass a number"
    ):
        PostHocEMA(SIGMA_RELS, snapshot_every=2.5, max_snapshot_gb=1.0)
