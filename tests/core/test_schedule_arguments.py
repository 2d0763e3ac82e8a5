"""NoiseSchedule's methods check their arguments at entry (`diffusion.core.schedule_inputs`), naming the argument:
a t past the end, negative, fractional, of another count than x's batch or on another device; noise (eps, a network
output) of another shape than x; an unknown prediction type; a posterior step forward in time. Before, each was
torch's raw IndexError or size mismatch, or a silent wrong result: t = -1 read the last timestep, 'epsilon' trained
a v-model, t_prev > t gave a negative variance (tester round 12b: X1, X2, X3, X14).

Reading t's range waits for a GPU, so the samplers and the bound, which build t themselves, pass
`check_range=False`: checked here by making any read of it fail while they run."""

import pytest
import torch

import diffusion.core.schedule
from diffusion.core.sampling import reverse_steps
from diffusion.core.schedule import NoiseSchedule
from diffusion.core.variational_bound import ReverseProcess, bound_terms
from diffusion.errors import InvalidValue, OutOfRange, WrongType

SCHEDULE = NoiseSchedule(num_timesteps=50)
X = torch.randn(2, 1, 4, 4)
T = torch.tensor([0, 49])

# Each public method taking t, called with that t (the other arguments good).
METHODS = {
    "q_sample": lambda t: SCHEDULE.q_sample(X, t, X),
    "predict_x0_from_eps": lambda t: SCHEDULE.predict_x0_from_eps(X, t, X),
    "predict_eps_from_x0": lambda t: SCHEDULE.predict_eps_from_x0(X, t, X),
    "velocity": lambda t: SCHEDULE.velocity(X, t, X),
    "training_target": lambda t: SCHEDULE.training_target("eps", X, t, X),
    "split_prediction": lambda t: SCHEDULE.split_prediction("v", X, t, X),
    "q_posterior": lambda t: SCHEDULE.q_posterior(X, X, t),
    "snr": lambda t: SCHEDULE.snr(t),
    "log_alphas_cumprod_at": lambda t: SCHEDULE.log_alphas_cumprod_at(t, 4),
}
BAD_TIMESTEPS = [  # (t, error, the start of the line); log_alphas_cumprod_at takes -1 (x_0 itself)
    (
        torch.tensor([0, 50]),
        OutOfRange,
        r"t=\[0, 50\] must be in (0|-1)\.\.49, the schedule's num_timesteps=50",
    ),
    (torch.tensor([-2, 1]), OutOfRange, r"t=\[-2, 1\] must be in (0|-1)\.\.49"),
    (torch.tensor([0.5, 1.0]), OutOfRange, r"t=<float32 tensor> must be of an integer dtype"),
    (torch.tensor([True, False]), OutOfRange, r"t=<bool tensor> must be of an integer dtype"),
]
WITHOUT_X = ["snr", "log_alphas_cumprod_at"]  # no batch to give one timestep to every sample of


@pytest.mark.parametrize("method", [name for name in METHODS if name not in WITHOUT_X])
def test_one_timestep_for_the_batch_is_taken_as_indexing_always_took_it(method):
    # A Python int, a 0-d tensor or a (B, 1) column: the same values as one (B,) timestep per sample (these forms
    # worked before the checks, and a public method keeps taking them); out of range, still refused
    expected = METHODS[method](torch.full((len(X),), 3))
    for t in (3, torch.tensor(3), torch.full((len(X), 1), 3)):
        torch.testing.assert_close(METHODS[method](t), expected, rtol=0, atol=0)
    with pytest.raises(OutOfRange, match=r"^t=50 must be in 0\.\.49"):
        METHODS[method](50)


@pytest.mark.parametrize("method", WITHOUT_X)
def test_a_timestep_without_a_batch_is_refused_where_no_x_gives_one(method):
    with pytest.raises(WrongType, match=r"^t=3 is an int, not a tensor of timesteps"):
        METHODS[method](3)
    with pytest.raises(OutOfRange, match=r"^t=<shape \(2, 1\)> must be of shape \(B,\)"):
        METHODS[method](torch.tensor([[0], [1]]))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("t", "error", "line"), BAD_TIMESTEPS)
def test_every_method_refuses_a_bad_t_by_name(method, t, error, line):
    with pytest.raises(error, match=rf"^{line}.* — pass "):
        METHODS[method](t)


@pytest.mark.parametrize("method", [name for name in METHODS if name != "log_alphas_cumprod_at"])
def test_a_negative_t_is_refused_not_counted_from_the_end(method):
    # t = -1 read the schedule's last timestep (Python's wrap-around), a silent wrong result.
    with pytest.raises(
        OutOfRange, match=r"^t=\[-1, 1\] must be in 0\.\.49.*a negative t does not count from"
    ):
        METHODS[method](torch.tensor([-1, 1]))
    METHODS[method](T)  # the range's ends are taken


@pytest.mark.parametrize("method", ["q_sample", "predict_x0_from_eps", "velocity", "q_posterior"])
def test_t_of_another_count_than_x_is_refused(method):
    with pytest.raises(OutOfRange, match=r"^t=<shape \(3,\)> must be of shape \(2,\), one per sample of x"):
        METHODS[method](torch.tensor([0, 1, 2]))


@pytest.mark.parametrize(
    ("call", "name"),
    [(lambda: SCHEDULE.q_sample(X, T, torch.randn(2, 1, 2, 2)), "noise"),
     (lambda: SCHEDULE.predict_x0_from_eps(X, T, X[:1]), "eps"),
     (lambda: SCHEDULE.split_prediction("eps", X, T, torch.randn(2, 2, 4, 4)), "output"),
     (lambda: SCHEDULE.q_posterior(X[:, :, :2], X, T), "x0")],
)  # fmt: skip
def test_a_tensor_of_another_shape_than_x_is_refused_by_name(call, name):
    with pytest.raises(OutOfRange, match=rf"^{name}=<shape .*> must be of x(0|_t)'s shape \(2, 1, 4, 4\)"):
        call()


def test_tensors_on_another_device_are_refused_by_name():
    with pytest.raises(
        InvalidValue, match=r"^t is on meta and x on cpu — put them on one device: t.to\(x.device\)"
    ):
        SCHEDULE.q_sample(X, T.to("meta"), X)
    with pytest.raises(InvalidValue, match=r"^noise is on meta and x on cpu"):
        SCHEDULE.q_sample(X, T, X.to("meta"))
    with pytest.raises(InvalidValue, match=r"^schedule is on cpu and x on meta .* schedule.to\(x.device\)"):
        SCHEDULE.q_sample(X.to("meta"), T.to("meta"), X.to("meta"))
    with pytest.raises(InvalidValue, match=r"^t is on meta and the schedule on cpu"):
        SCHEDULE.snr(T.to("meta"))


@pytest.mark.parametrize("method", ["training_target", "split_prediction"])
@pytest.mark.parametrize("name", ["epsilon", "bogus"])
def test_an_unknown_prediction_type_is_refused_not_taken_as_v(method, name):
    # Both fell through to v: 'epsilon' (diffusers' name) trained and decoded a v-model without a word.
    with pytest.raises(
        InvalidValue, match=rf"^prediction_type='{name}' is not supported — choose one of \['eps'"
    ):
        getattr(SCHEDULE, method)(name, X, T, X)


@pytest.mark.parametrize(("t", "t_prev"), [([5, 5], [6, 6]), ([10, 3], [20, 2]), ([5, 5], [5, 4])])
def test_a_posterior_step_forward_in_time_is_refused(t, t_prev):
    # t_prev > t returned a negative "variance" (-6.48 for 10 -> 20); t_prev = t none at all.
    with pytest.raises(OutOfRange, match=r"^t_prev=\[.*\] must be < t=\[.*\] for every sample"):
        SCHEDULE.q_posterior(X, X, torch.tensor(t), torch.tensor(t_prev))


def test_the_posterior_takes_every_step_back_in_time_down_to_x0():
    _, variance, _ = SCHEDULE.q_posterior(X, X, torch.tensor([0, 49]), torch.tensor([-1, 0]))
    assert (variance >= 0).all()
    with pytest.raises(OutOfRange, match=r"^t_prev=\[-2, 0\] must be in -1\.\.49"):
        SCHEDULE.q_posterior(X, X, torch.tensor([0, 49]), torch.tensor([-2, 0]))


def test_check_range_false_reads_no_timestep_but_checks_the_rest(monkeypatch):
    def no_read(*args, **kwargs):
        raise AssertionError("t's values were read")

    monkeypatch.setattr(torch, "aminmax", no_read)
    SCHEDULE.q_sample(X, T, X, check_range=False)
    with pytest.raises(OutOfRange, match=r"^t=<shape \(3,\)>"):  # the metadata is checked all the same
        SCHEDULE.q_sample(X, torch.tensor([0, 1, 2]), X, check_range=False)
    with pytest.raises(AssertionError, match="were read"):  # the public default reads them
        SCHEDULE.q_sample(X, T, X)


class ZeroNetwork(torch.nn.Module):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


@pytest.mark.parametrize("options", [{"sampler": "ddpm"}, {"sampler": "ddim", "eta": 1.0}])
def test_the_samplers_and_the_bound_read_no_timestep(monkeypatch, options):
    # Reading t waits for a GPU at every step: the samplers and the bound build t themselves and skip it.
    def no_read(*args, **kwargs):
        raise AssertionError("t's values were read")

    def step_back(t, t_prev, check_range):
        assert not check_range, "t_prev < t was read"

    monkeypatch.setattr(torch, "aminmax", no_read)
    monkeypatch.setattr(diffusion.core.schedule, "check_step_back", step_back)
    steps = list(reverse_steps(ZeroNetwork(), SCHEDULE, torch.randn(2, 1, 4, 4), steps=5, **options))
    assert len(steps) == 5 and torch.isfinite(steps[-1].x).all()
    bound_terms(ZeroNetwork(), SCHEDULE, ReverseProcess(), X.clamp(-1, 1), torch.arange(2))
