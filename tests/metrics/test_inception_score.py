"""The Inception Score: the papers' formula over 10 splits, computed from the logits of the same Inception pass
that gives FID's features. Nothing downloads: the network has random weights (tests/metrics/conftest.py)."""

import re

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from diffusion.cli import evaluate
from diffusion.metrics.inception_score import InceptionScore
from diffusion.metrics.sample_quality import SampleQuality


def reference_inception_score(logits: np.ndarray, splits: int = 10) -> tuple[float, float]:
    """exp(E_x KL(p(y|x) || p(y))) per split as the original code (Salimans et al. 2016) computes it: softmax,
    consecutive splits [i * N // splits, (i + 1) * N // splits), mean and population std of the splits."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    scores = []
    for i in range(splits):
        part = probabilities[i * len(logits) // splits : (i + 1) * len(logits) // splits]
        marginal = part.mean(axis=0, keepdims=True)
        kl = (part * (np.log(part) - np.log(marginal))).sum(axis=1)
        scores.append(np.exp(kl.mean()))
    return float(np.mean(scores)), float(np.std(scores))


def test_inception_score_is_the_papers_formula_over_10_splits():
    # Images each certain of one of K classes, all K equally often in every split: IS = K exactly.
    for classes in (1, 7):
        logits = torch.full((70, 1008), -50.0)
        logits[torch.arange(70), torch.arange(70) % classes] = 50.0
        metric = InceptionScore()
        metric.update(logits)
        mean, std = metric.compute()
        assert float(mean) == pytest.approx(classes, rel=1e-9) and float(std) == pytest.approx(0, abs=1e-9)
    # Random logits, a count that 10 does not divide (splits of 100 and 101), fed in uneven batches.
    logits = torch.randn(1003, 1008, generator=torch.Generator().manual_seed(0)) * 3
    metric = InceptionScore()
    for batch in logits.split(333):
        metric.update(batch)
    mean, std = metric.compute()
    expected_mean, expected_std = reference_inception_score(logits.numpy())
    assert float(mean) == pytest.approx(expected_mean, rel=1e-9) and expected_mean > 1.5
    assert float(std) == pytest.approx(expected_std, rel=1e-6) and expected_std > 0
    # Fewer samples than splits: a split would be empty.
    few = InceptionScore()
    few.update(logits[:9])
    with pytest.raises(
        ValueError, match=r"needs at least 10 samples, got 9 — feed more samples with update\("
    ):
        few.compute()


def test_inception_score_needs_inception_features():
    with pytest.raises(ValueError, match="Inception Score needs Inception features.*not pixels"):
        SampleQuality("pixels", ["fid", "is"], channels=1)


@pytest.mark.slow  # 24 images through a full InceptionV3
def test_evaluate_gives_fid_kid_and_is_from_one_inception_pass(
    inception_weights, tmp_path, monkeypatch, capsys
):
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    digits = (load_digits().images * (255 / 16)).round().astype(np.uint8)[..., None]  # (1797, 8, 8, 1)
    np.savez(tmp_path / "samples.npz", digits[:20])
    np.savez(tmp_path / "reference.npz", digits[100:104])
    seen, pools, hooked = [], [], []
    original = FeatureExtractorInceptionV3.forward

    def watched(self, images):
        seen.append(len(images))
        if not hooked:
            hooked.append(
                self.AvgPool.register_forward_hook(lambda module, args, out: pools.append(out.flatten(1)))
            )
        return original(self, images)

    monkeypatch.setattr(FeatureExtractorInceptionV3, "forward", watched)
    args = ["--samples", str(tmp_path / "samples.npz"), "--reference", str(tmp_path / "reference.npz"),
            "--features", "inception", "--inception_weights", str(inception_weights), "--batch_size", "10"]  # fmt: skip
    result = evaluate.main(args)
    # One pass over every image (reference, then samples) feeds FID, KID and IS alike.
    assert sum(seen) == 24
    assert {"fid", "kid_mean", "is_mean", "is_std"} <= set(result) and result["num_fake"] == 20
    # IS from the samples' logits without the head's bias (torch-fidelity's "logits_unbiased", what the
    # original code's matmul(pool3, w) gives), computed here from the pool features and the weights file.
    fc_weight = torch.load(inception_weights)["fc.weight"].double()  # (1008, 2048)
    sample_pools = torch.cat(pools[-2:]).double()  # the samples' two batches, after the reference's one
    expected = reference_inception_score((sample_pools @ fc_weight.T).numpy())
    assert result["is_mean"] == pytest.approx(expected[0], rel=1e-5) and expected[0] > 1.2
    assert result["is_std"] == pytest.approx(expected[1], rel=1e-4)
    out = capsys.readouterr().out
    assert re.search(rf"IS:  {result['is_mean']:.4f} ± {result['is_std']:.4f} \(10 splits\)", out), out
