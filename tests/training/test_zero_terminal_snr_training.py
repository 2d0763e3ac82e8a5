"""A zero-terminal-SNR run (Lin et al. 2024: `--model.zero_terminal_snr true` with v-prediction) trains, keeps the
option in its checkpoint, and samples from pure noise with the samplers, through the commands users run."""

import numpy as np
from helpers import tiny_run

from diffusion.cli.sample import main as sample
from diffusion.core.sampling import SamplingOptions
from diffusion.training.loading import load_checkpoint


def test_a_zero_terminal_snr_v_prediction_run_trains_and_samples_from_pure_noise(tmp_path):
    tiny_run(tmp_path, "--model.zero_terminal_snr", "true", "--model.prediction_type", "v",
             "--sample_grid.sampling.sampler", "heun")  # fmt: skip
    checkpoint = tmp_path / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    module = load_checkpoint(str(checkpoint))
    assert module.hparams.zero_terminal_snr and module.schedule.alphas_cumprod[-1].item() == 0
    x_T, noise = module.initial_noise(2, seed=0)
    first = next(module.trajectory(x_T, noise, SamplingOptions(sampler="ddim", steps=3)))
    assert first.t == 999 and first.x0.isfinite().all()
    out = tmp_path / "samples"
    sample(["--ckpt", str(checkpoint), "--num_samples", "4", "--out", str(out), "--sampler", "euler_ancestral",
            "--steps", "3", "--spacing", "trailing", "--device", "cpu"])  # fmt: skip
    images = np.load(out / "samples.npz")["arr_0"]
    assert images.shape == (4, 8, 8, 1) and len({image.tobytes() for image in images}) == 4
    for sampler in ("dpmpp_2m_sde", "heun"):
        assert module.sample(2, seed=1, options=SamplingOptions(sampler=sampler, steps=3)).isfinite().all()
