"""EMA of the weights (diffusion.training.callbacks.EMA on Lightning's WeightAveraging), checked against a hand-computed
average of the raw weights recorded after every optimizer step.

torch.optim.swa_utils.AveragedModel semantics: the first update copies the weights (n_averaged == 0); update
n + 1 (n >= 1) computes decay_n * ema + (1 - decay_n) * w with decay_n = min(decay, (1 + n) / (10 + n)).
EMA averages only the parameters (use_buffers=False): the EMA copy's buffers, here the constant schedule, follow
the module's.
"""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from diffusion.data.vectors import VectorDataModule
from diffusion.models import MLP
from diffusion.training.callbacks import EMA
from diffusion.training.loading import load_checkpoint
from diffusion.training.module import DiffusionModule

DECAY = 0.2  # low, so both branches of min(decay, (1 + n) / (10 + n)) are used: 2/11 at n = 1, then 0.2
ACCUMULATE = 2
BATCHES_PER_EPOCH = 4  # 256 points, 5% held out, batch 64: an epoch is 2 optimizer steps


class Recorder(L.Callback):
    """Raw weights after every optimizer step; EMA's update count after every micro-batch; the weights the
    module holds at the end of each validation epoch (what SampleGrid samples with)."""

    def __init__(self, ema: EMA) -> None:
        self.ema = ema
        self.raw_after_step: list[dict[str, torch.Tensor]] = []
        self.updates_after_batch: list[int] = []
        self.weights_in_validation: list[dict[str, torch.Tensor]] = []
        self._last_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Runs after EMA's own on_train_batch_end (callbacks are called in list order).
        if trainer.global_step > self._last_step:
            self._last_step = trainer.global_step
            self.raw_after_step.append(clone(pl_module.state_dict()))
        self.updates_after_batch.append(int(self.ema._average_model.n_averaged))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.weights_in_validation.append(clone(pl_module.state_dict()))


def clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in state.items()}


def hand_ema(raw_after_step: list[dict[str, torch.Tensor]], decay: float) -> dict[str, torch.Tensor]:
    ema = {key: value.double() for key, value in raw_after_step[0].items()}  # first update: a copy
    for n, raw in enumerate(raw_after_step[1:], start=1):
        d = min(decay, (1 + n) / (10 + n))
        ema = {key: d * ema[key] + (1 - d) * raw[key].double() for key in ema}
    return ema


def assert_state_close(actual: dict, expected: dict, atol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(
            actual[key].double(), expected[key].double(), atol=atol, rtol=1e-5, msg=key
        )


def max_difference(a: dict, b: dict) -> float:
    return max((a[key].double() - b[key].double()).abs().max().item() for key in a)


def fit(root, max_steps: int, val_every_batches: int, ckpt_path=None, init_seed: int = 0):
    """A tiny toy-2D fit with EMA under accumulate_grad_batches=2; returns (module, recorder, last.ckpt)."""
    L.seed_everything(0)  # also fixes the data order (the sampler's seed is PL_GLOBAL_SEED)
    torch.manual_seed(init_seed)
    data = VectorDataModule("swiss_roll", num_samples=256, batch_size=64)
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8)
    # per_sample noise depends on (seed, step, index) only, so a resumed run draws what an uninterrupted one does.
    module = DiffusionModule(
        network, sample_shape=(2,), normalization=data.normalization, num_timesteps=100, lr=3e-2,
        warmup_steps=1, noise_mode="per_sample", noise_seed=0,
    )  # fmt: skip
    ema = EMA(decay=DECAY)
    recorder = Recorder(ema)
    trainer = L.Trainer(
        max_steps=max_steps, accumulate_grad_batches=ACCUMULATE, val_check_interval=val_every_batches,
        check_val_every_n_epoch=None, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root, accelerator="cpu", devices=1,
        callbacks=[ema, recorder, ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)],
    )  # fmt: skip
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return module, recorder, root / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """4 optimizer steps (8 micro-batches), validating (and so checkpointing) every 2 steps."""
    return fit(tmp_path_factory.mktemp("ema4"), max_steps=4, val_every_batches=2 * ACCUMULATE)


def test_ema_equals_hand_computed_average_of_raw_weights(four_steps):
    module, recorder, last = four_steps
    assert len(recorder.raw_after_step) == 4
    expected = hand_ema(recorder.raw_after_step, DECAY)
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 4
    assert_state_close(checkpoint["state_dict"], expected)  # the EMA weights
    assert_state_close(checkpoint["current_model_state"], recorder.raw_after_step[-1])  # the raw weights
    assert max_difference(checkpoint["state_dict"], checkpoint["current_model_state"]) > 1e-3  # not trivial
    # Lightning leaves the EMA weights in the module after fit.
    assert_state_close(module.state_dict(), expected)
    # Validation (and so SampleGrid in on_validation_epoch_end) sees the EMA weights, at steps 2 and 4.
    assert len(recorder.weights_in_validation) == 2
    assert_state_close(recorder.weights_in_validation[0], hand_ema(recorder.raw_after_step[:2], DECAY))
    assert_state_close(recorder.weights_in_validation[1], expected)


def test_ema_updates_once_per_optimizer_step_not_per_micro_batch(four_steps):
    _, recorder, last = four_steps
    # 8 micro-batches, an optimizer step after every second one: the update count follows the steps.
    assert recorder.updates_after_batch == [0, 1, 1, 2, 2, 3, 3, 4]
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert int(checkpoint["averaging_state"]["n_averaged"]) == 4


def test_resume_restores_ema_and_matches_an_uninterrupted_run(four_steps, tmp_path):
    _, _, uninterrupted = four_steps
    _, _, halfway = fit(tmp_path / "first", max_steps=2, val_every_batches=2 * ACCUMULATE)
    assert torch.load(halfway, weights_only=False)["global_step"] == 2
    # A different initialization: everything must come from the checkpoint.
    module, recorder, resumed = fit(
        tmp_path / "second", max_steps=4, val_every_batches=2 * ACCUMULATE, ckpt_path=halfway, init_seed=1
    )
    assert recorder.updates_after_batch == [2, 3, 3, 4]  # continues from n_averaged = 2
    expected, actual = (torch.load(p, weights_only=False) for p in (uninterrupted, resumed))
    assert actual["global_step"] == 4
    assert_state_close(actual["state_dict"], expected["state_dict"], atol=1e-5)
    assert_state_close(actual["current_model_state"], expected["current_model_state"], atol=1e-5)


def test_checkpoint_written_at_train_end_keeps_the_raw_weights(tmp_path):
    _, recorder, last = fit(tmp_path, max_steps=3, val_every_batches=1000)  # never validates
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3
    assert_state_close(checkpoint["state_dict"], hand_ema(recorder.raw_after_step, DECAY))
    assert_state_close(checkpoint["current_model_state"], recorder.raw_after_step[-1])


def test_load_checkpoint_returns_ema_or_raw_weights(toy2d_checkpoint):
    checkpoint = torch.load(toy2d_checkpoint, map_location="cpu", weights_only=False)
    ema, raw = (
        load_checkpoint(toy2d_checkpoint, weights="ema"),
        load_checkpoint(toy2d_checkpoint, weights="raw"),
    )
    assert_state_close(ema.state_dict(), checkpoint["state_dict"], atol=0)
    assert_state_close(raw.state_dict(), checkpoint["current_model_state"], atol=0)
    assert max_difference(ema.state_dict(), raw.state_dict()) > 1e-4
    # Same network config, schedule and options: only the weights differ.
    assert ema.hparams == raw.hparams and not ema.training and not raw.training
    with pytest.raises(ValueError, match="weights='average'"):
        load_checkpoint(toy2d_checkpoint, weights="average")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"decay": 1.5}, "decay=1.5"),
        ({"decay": 0.0}, "decay=0.0"),
        ({"update_every_n_steps": 0}, "update_every"),
        ({"update_every_n_steps": 1.5}, "update_every_n_steps=1.5 must be a whole number"),
    ],
)
def test_bad_ema_options_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EMA(**kwargs)


def test_ema_keeps_the_schedule_buffers_up_to_rounding(four_steps):
    # The schedule is not averaged: the EMA weights carry the module's schedule.
    _, _, last = four_steps
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    for key in ("schedule.alphas_cumprod", "schedule.betas"):
        torch.testing.assert_close(checkpoint["state_dict"][key], checkpoint["current_model_state"][key])


def tiny_module() -> DiffusionModule:
    torch.manual_seed(0)
    network = MLP(in_channels=2, hidden_dim=16, num_blocks=1, time_embed_dim=8)
    return DiffusionModule(network, sample_shape=(2,), beta_schedule="cosine", num_timesteps=10)


@pytest.mark.parametrize("warmup", [True, False])
def test_foreach_update_follows_the_decay_formula(warmup):
    module = tiny_module()
    ema = EMA(decay=0.5, warmup=warmup)
    ema.setup(None, module, "fit")
    raw = []
    for step in range(4):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p) * (step + 1))
            module.schedule.betas.add_(1.0)  # buffers are not averaged: the EMA copy takes the module's
        raw.append(clone(dict(module.named_parameters())))
        ema.update(module)
    expected = {key: value.double() for key, value in raw[0].items()}  # first update: a copy
    for n, weights in enumerate(raw[1:], start=1):
        d = min(0.5, (1 + n) / (10 + n)) if warmup else 0.5
        expected = {key: d * expected[key] + (1 - d) * weights[key].double() for key in expected}
    assert_state_close(dict(ema._average_model.module.named_parameters()), expected)
    assert int(ema._average_model.n_averaged) == 4  # what checkpoints store and resume from
    for ema_buffer, buffer in zip(ema._average_model.module.buffers(), module.buffers(), strict=True):
        assert torch.equal(ema_buffer, buffer)


def test_ema_update_never_reads_a_value_back_from_the_device():
    """Meta tensors have no values: a host sync (.item(), bool(), int()) on one raises. The update runs on a
    meta module, so it reads nothing back from the device (on a GPU, no sync per step); the AveragedModel
    path Lightning uses by default does read n_averaged back."""
    module = tiny_module().to("meta")
    ema = EMA(decay=0.9)
    ema.setup(None, module, "fit")
    for _ in range(3):
        ema.update(module)
    assert ema._num_updates == 3 and ema._average_model.n_averaged.device.type == "meta"
    with pytest.raises(RuntimeError, match="meta"):
        ema._average_model.update_parameters(module)
