"""Sample-quality metrics that need no downloaded weights: scikit-learn's digits and toy 2-D data.

- `frechet_distance`: FID's formula (Heusel et al. 2017) on raw features, here 8x8 digit pixels.
- `classifier_scores`: the Inception Score analogue exp(E_x KL(p(y|x) || p(y))) (Salimans et al. 2016) and the
  mean top-class probability, from a logistic regression trained on real digits.
- `sliced_wasserstein`: the mean over random directions of the 1-D W1 between projections (Rabin et al. 2011).
"""

import functools
import warnings

import numpy as np
import scipy.linalg
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

NUM_DIGITS = 1797
REFERENCE_SIZE = 898  # the first half of a fixed permutation; the other 899 measure the real-data floor


def single_threaded(fn):
    """Run with one BLAS thread: these problems are tiny, and a multi-threaded BLAS beside torch's threads (or
    other processes) on a small machine is 50-200x slower (logistic regression: 5 s instead of 0.03 s)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threadpool_limits(limits=1):
            return fn(*args, **kwargs)

    return wrapper


@single_threaded
def frechet_distance(x: np.ndarray, y: np.ndarray) -> float:
    """||mu_x - mu_y||^2 + Tr(S_x + S_y - 2 (S_x S_y)^(1/2)) between the Gaussians fitted to (N, D) features."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    mu_x, mu_y = x.mean(axis=0), y.mean(axis=0)
    cov_x, cov_y = np.atleast_2d(np.cov(x, rowvar=False)), np.atleast_2d(np.cov(y, rowvar=False))
    with warnings.catch_warnings():
        # Digits have always-blank corner pixels, so the covariances are singular; sqrtm still converges.
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(cov_x @ cov_y)
        if not np.isfinite(covmean).all():  # as pytorch-fid: regularize a product sqrtm cannot handle
            offset = np.eye(len(cov_x)) * 1e-6
            covmean = scipy.linalg.sqrtm((cov_x + offset) @ (cov_y + offset))
    covmean = np.real(covmean)
    return float(((mu_x - mu_y) ** 2).sum() + np.trace(cov_x) + np.trace(cov_y) - 2 * np.trace(covmean))


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits (N, 64) in 0..16 split by a fixed permutation: reference (898) and other (899)
    images with their labels: (reference, reference_labels, other, other_labels)."""
    digits = load_digits()
    perm = np.random.default_rng(0).permutation(NUM_DIGITS)
    ref, other = perm[:REFERENCE_SIZE], perm[REFERENCE_SIZE:]
    images, labels = digits.data.astype(np.float64), digits.target
    return images[ref], labels[ref], images[other], labels[other]


def to_digit_features(images: np.ndarray) -> np.ndarray:
    """uint8 images (N, H, W[, 1]) with H = W a multiple of 8 -> (N, 64) in scikit-learn's 0..16 range.

    Averaging each (H/8 x W/8) block undoes the data module's nearest-neighbour upscaling exactly.
    """
    images = np.asarray(images, dtype=np.float64)
    if images.ndim == 4:
        if images.shape[-1] != 1:
            raise ValueError(f"expected one channel, got images of shape {images.shape}")
        images = images[..., 0]
    n, height, width = images.shape
    if height != width or height % 8:
        raise ValueError(f"expected square images with a side that is a multiple of 8, got {images.shape}")
    f = height // 8
    blocks = images.reshape(n, 8, f, 8, f).mean(axis=(2, 4))  # (N, 8, 8)
    return (blocks / 255 * 16).reshape(n, 64)


@single_threaded
def train_digit_classifier(images: np.ndarray, labels: np.ndarray) -> LogisticRegression:
    """A softmax classifier on (N, 64) digits in 0..16: ~97% accuracy on the other half, and unlike an
    SVM or a small MLP it stays unsure on noise (mean top probability ~0.5), so confidence means something."""
    return LogisticRegression(C=1.0, max_iter=5000, random_state=0).fit(images / 16, labels)


@single_threaded
def classifier_scores(classifier: LogisticRegression, images: np.ndarray) -> tuple[float, float]:
    """(Inception-Score analogue, mean max-probability) of (N, 64) digits in 0..16.

    The score is exp(E_x KL(p(y|x) || p(y))): between 1 (every sample gives the same class distribution)
    and 10 (confident and spread evenly over the ten digits).
    """
    probs = np.clip(classifier.predict_proba(np.asarray(images, dtype=np.float64) / 16), 1e-12, 1.0)
    marginal = probs.mean(axis=0, keepdims=True)
    kl = (probs * (np.log(probs) - np.log(marginal))).sum(axis=1)
    return float(np.exp(kl.mean())), float(probs.max(axis=1).mean())


@single_threaded
def sliced_wasserstein(x: np.ndarray, y: np.ndarray, num_projections: int = 200, seed: int = 0) -> float:
    """Mean W1 over `num_projections` random unit directions between (N, D) sets of equal size N.

    With equal counts the 1-D W1 is the mean absolute difference of the sorted projections.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"need two (N, D) arrays of the same shape, got {x.shape} and {y.shape}")
    directions = np.random.default_rng(seed).standard_normal((x.shape[1], num_projections))
    directions /= np.linalg.norm(directions, axis=0, keepdims=True)
    x_proj, y_proj = np.sort(x @ directions, axis=0), np.sort(y @ directions, axis=0)  # (N, P)
    return float(np.abs(x_proj - y_proj).mean())
