"""`--model.lr_schedule cosine`: linear warmup, then half a cosine to zero at the run's last step."""

import math
import warnings

import lightning as L
import pytest
import torch
from helpers import tiny_run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from diffusion.cli.train_warnings import one_line_notes
from diffusion.training.module import LEARNING_RATE, TRAIN_LOSS
from diffusion.training.optim import lr_factor, warmup_scheduler
from diffusion.training.option_notes import RunNote


def test_warmup_then_constant_or_cosine_to_zero():
    cosine = dict(schedule="cosine", warmup_steps=10, total_steps=110)
    assert [lr_factor(s, **cosine) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_factor(10, **cosine) == pytest.approx(1.0)
    assert lr_factor(60, **cosine) == pytest.approx(0.5)  # half way through the decay
    assert lr_factor(35, **cosine) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor(110, **cosine) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(500, **cosine) == pytest.approx(0.0, abs=1e-12)  # past the end it stays at zero
    constant = dict(cosine, schedule="constant")
    assert [lr_factor(s, **constant) for s in (4, 10, 60, 500)] == pytest.approx([0.5, 1.0, 1.0, 1.0])


class RecordLR(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_training_steps_follow_the_schedule_and_log_it_at_the_logging_steps(schedule, tmp_path):
    cli = tiny_run(tmp_path, "--model.lr", "0.01", "--model.warmup_steps", "2", "--model.lr_schedule", schedule,
                   "--max_steps", "6", "--trainer.log_every_n_steps", "2",
                   "--trainer.callbacks+", "test_lr_schedule.RecordLR")  # fmt: skip
    record = next(c for c in cli.trainer.callbacks if isinstance(c, RecordLR))
    expected = [0.01 * lr_factor(s, schedule=schedule, warmup_steps=2, total_steps=6) for s in range(6)]
    assert record.lrs == pytest.approx(expected)
    assert (record.lrs[-1] < 0.002) == (schedule == "cosine")
    # train/lr beside train/loss, at the same steps (the logging steps: every 2nd), nothing in between.
    events = EventAccumulator(str(tmp_path / "digits" / "version_0"))
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in (LEARNING_RATE, TRAIN_LOSS)}
    assert sorted(logged[LEARNING_RATE]) == sorted(logged[TRAIN_LOSS]) == [1, 3, 5]
    assert list(logged[LEARNING_RATE].values()) == pytest.approx([expected[s] for s in (1, 3, 5)])


def test_a_resumed_scheduler_decays_over_the_runs_new_length():
    # Extending a finished run with a larger max_steps: the checkpointed scheduler state must not pin the
    # first run's length, or the extension would train at a learning rate of zero.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = warmup_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=100)
    for _ in range(100):
        optimizer.step()
        first.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    extended = warmup_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=200)
    extended.load_state_dict(first.state_dict())
    optimizer.step()
    extended.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_factor(101, schedule="cosine", warmup_steps=1,
                                                                      total_steps=200))  # fmt: skip
    assert optimizer.param_groups[0]["lr"] > 0.4


def test_a_resume_whose_rate_would_jump_says_so_and_one_that_continues_does_not(recwarn):
    # A cosine run of 200 steps stopped at 74 and resumed with max_steps 80 fell from 0.6x to 0.02x of the peak
    # rate at once, without a word (tester round 21a)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = warmup_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=200)
    for _ in range(74):
        optimizer.step()
        first.step()
    before = lr_factor(74, schedule="cosine", warmup_steps=1, total_steps=200)
    now = lr_factor(74, schedule="cosine", warmup_steps=1, total_steps=80)
    with pytest.warns(UserWarning) as said:
        warmup_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=80).load_state_dict(
            first.state_dict()
        )
    assert [str(warning.message) for warning in said] == [
        f"the learning rate jumps from {before:.3g} to {now:.3g} at the resumed step 74: the cosine schedule "
        "follows this run's max_steps (80), not the length the checkpoint's run decayed over — resume with the "
        "max_steps the run was started with to keep its decay (a longer run: start one with the longer max_steps)"
    ]
    recwarn.clear()
    for total in (
        200,
        210,
    ):  # the same length, or one changed a little (a rate 0.02x of the peak off): no word
        warmup_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=total).load_state_dict(
            first.state_dict()
        )
    warmup_scheduler(optimizer, "constant", warmup_steps=1, total_steps=80).load_state_dict(
        first.state_dict()
    )
    assert not [warning for warning in recwarn if "learning rate jumps" in str(warning.message)]


def test_train_py_says_the_jump_of_a_cosine_run_resumed_with_another_length(tmp_path, recwarn):
    cosine = ["--model.lr_schedule", "cosine", "--model.warmup_steps", "1", "--model.lr", "0.01"]
    tiny_run(tmp_path, *cosine)  # 4 steps: the rate ends at zero
    assert not [warning for warning in recwarn if "learning rate jumps" in str(warning.message)]
    tiny_run(tmp_path, *cosine, "--max_steps", "5", "--ckpt_path", "last")
    now = 0.01 * lr_factor(4, schedule="cosine", warmup_steps=1, total_steps=5)
    said = [str(warning.message) for warning in recwarn if "learning rate jumps" in str(warning.message)]
    # a RunNote: train.py shows it as one line, `warning: ...`, not Python's file:line form (tester round 23a)
    assert [w.category for w in recwarn if "learning rate jumps" in str(w.message)] == [RunNote]
    with one_line_notes():
        assert warnings.formatwarning(said[0], RunNote, "optim.py", 68) == f"warning: {said[0]}\n"
    assert said == [
        f"the learning rate jumps from 0 to {now:.3g} at the resumed step 4: the cosine schedule follows this "
        "run's max_steps (5), not the length the checkpoint's run decayed over — resume with the max_steps the run "
        "was started with to keep its decay (a longer run: start one with the longer max_steps)"
    ]
