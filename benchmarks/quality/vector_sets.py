"""Vector distributions with fine structure, and how far a point lies from the structure that generates them.

Every distribution is a weighted union of parts (Gaussian clusters, thin rings, a thin spiral, heavy-tailed
spokes). Each part knows its generating structure exactly, so for any point it gives a *normalized distance*:
the distance to the structure in units of the local noise scale (||x - mu_k|| / sigma_k for a cluster, the
distance to the ring / curve / spoke over its thickness), and the mode the point belongs to. A distribution's
distance is the smallest over its parts. `benchmarks/quality/vectors.py` turns these into scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree


@dataclass
class Clusters:
    """Isotropic Gaussians N(centers[k], sigmas[k]^2 I) with mixture weights; one mode per cluster."""

    centers: np.ndarray  # (K, D)
    sigmas: np.ndarray  # (K,)
    weights: np.ndarray  # (K,), sums to 1

    @property
    def num_modes(self) -> int:
        return len(self.centers)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        modes = rng.choice(self.num_modes, size=n, p=self.weights)
        noise = rng.standard_normal((n, self.centers.shape[1]))
        return self.centers[modes] + self.sigmas[modes, None] * noise, modes

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # (N, K) normalized distances; the nearest in sigma units wins (a tiny cluster next to a big one).
        distance = np.linalg.norm(x[:, None, :] - self.centers[None], axis=2) / self.sigmas[None]
        modes = distance.argmin(axis=1)
        return distance[np.arange(len(x)), modes], modes


@dataclass
class Rings:
    """Circles of radius radii[k] around centers[k], Gaussian radial noise sigmas[k], points uniform in
    angle; each ring is split into `arcs` equal arcs, each one mode (a ring half drawn is not covered)."""

    centers: np.ndarray  # (K, 2)
    radii: np.ndarray  # (K,)
    sigmas: np.ndarray  # (K,)
    weights: np.ndarray  # (K,)
    arcs: int = 8

    @property
    def num_modes(self) -> int:
        return len(self.radii) * self.arcs

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        ring = rng.choice(len(self.radii), size=n, p=self.weights)
        angle = rng.uniform(0, 2 * np.pi, n)
        radius = self.radii[ring] + self.sigmas[ring] * rng.standard_normal(n)
        points = self.centers[ring] + radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1)
        return points, ring * self.arcs + (angle / (2 * np.pi) * self.arcs).astype(int) % self.arcs

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offset = x[:, None, :] - self.centers[None]  # (N, K, 2)
        distance = np.abs(np.linalg.norm(offset, axis=2) - self.radii[None]) / self.sigmas[None]  # (N, K)
        ring = distance.argmin(axis=1)
        rows = np.arange(len(x))
        angle = np.arctan2(offset[rows, ring, 1], offset[rows, ring, 0]) % (2 * np.pi)
        arc = (angle / (2 * np.pi) * self.arcs).astype(int) % self.arcs
        return distance[rows, ring], ring * self.arcs + arc


@dataclass
class Spiral:
    """The curve r = theta / (2 pi) for theta in [theta_start, theta_end] (a 1-D curve in 2-D), points uniform
    in theta plus isotropic noise sigma; the theta range is split into `segments` modes."""

    theta_start: float
    theta_end: float
    sigma: float
    segments: int = 12

    def __post_init__(self) -> None:
        # Dense enough that the polyline is within sigma / 50 of the curve (spacing << sigma).
        theta = np.linspace(self.theta_start, self.theta_end, 200_000)
        self._theta = theta
        self._tree = cKDTree(self._curve(theta))

    @property
    def num_modes(self) -> int:
        return self.segments

    def _curve(self, theta: np.ndarray) -> np.ndarray:
        return (theta / (2 * np.pi))[:, None] * np.stack([np.cos(theta), np.sin(theta)], axis=1)

    def _segment(self, theta: np.ndarray) -> np.ndarray:
        fraction = (theta - self.theta_start) / (self.theta_end - self.theta_start)
        return np.minimum((fraction * self.segments).astype(int), self.segments - 1)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        theta = rng.uniform(self.theta_start, self.theta_end, n)
        return self._curve(theta) + self.sigma * rng.standard_normal((n, 2)), self._segment(theta)

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distance, nearest = self._tree.query(x)
        return distance / self.sigma, self._segment(self._theta[nearest])


@dataclass
class Spokes:
    """Rays from the origin at `num_spokes` even angles; radius 1 + Lomax(alpha) (heavy-tailed: alpha = 1.5
    has infinite variance) and noise across the ray of std `width` x radius (thin wedges). One mode per ray."""

    num_spokes: int
    alpha: float
    width: float

    @property
    def num_modes(self) -> int:
        return self.num_spokes

    def _directions(self) -> np.ndarray:
        angles = np.arange(self.num_spokes) * 2 * np.pi / self.num_spokes
        return np.stack([np.cos(angles), np.sin(angles)], axis=1)  # (S, 2)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        spoke = rng.integers(0, self.num_spokes, n)
        radius = 1 + rng.pareto(self.alpha, n)
        direction = self._directions()[spoke]
        normal = np.stack([-direction[:, 1], direction[:, 0]], axis=1)
        across = self.width * radius * rng.standard_normal(n)
        return radius[:, None] * direction + across[:, None] * normal, spoke

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        along = x @ self._directions().T  # (N, S)
        across = np.abs(x @ np.stack([-self._directions()[:, 1], self._directions()[:, 0]], axis=1).T)
        # Distance across the ray in units of its local thickness; behind the origin is off every spoke.
        distance = np.where(along > 0, across / (self.width * np.maximum(along, 1e-12)), np.inf)
        spoke = distance.argmin(axis=1)
        return distance[np.arange(len(x)), spoke], spoke


Part = Clusters | Rings | Spiral | Spokes


@dataclass
class Distribution:
    """A weighted union of parts; modes are numbered part by part."""

    name: str
    description: str
    parts: list[Part]
    part_weights: list[float]

    @property
    def dim(self) -> int:
        return 2 if not isinstance(self.parts[0], Clusters) else self.parts[0].centers.shape[1]

    @property
    def num_modes(self) -> int:
        return sum(part.num_modes for part in self.parts)

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(points (n, D), mode of each point), deterministic in seed."""
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(n, self.part_weights)
        points, modes, offset = [], [], 0
        for part, count in zip(self.parts, counts, strict=True):
            p, m = part.sample(int(count), rng)
            points.append(p)
            modes.append(m + offset)
            offset += part.num_modes
        order = rng.permutation(n)
        return np.concatenate(points)[order], np.concatenate(modes)[order]

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(normalized distance to the nearest part, mode there) for every row of x (N, D)."""
        best = np.full(len(x), np.inf)
        modes = np.zeros(len(x), dtype=int)
        offset = 0
        for part in self.parts:
            distance, mode = part.locate(x)
            closer = distance < best
            best[closer], modes[closer] = distance[closer], mode[closer] + offset
            offset += part.num_modes
        return best, modes


def _grid(side: int, spacing: float) -> np.ndarray:
    axis = (np.arange(side) - (side - 1) / 2) * spacing
    return np.stack(np.meshgrid(axis, axis), axis=-1).reshape(-1, 2)


def _circle(n: int, radius: float, phase: float = 0.0) -> np.ndarray:
    angles = phase + np.arange(n) * 2 * np.pi / n
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def distributions() -> dict[str, Distribution]:
    """The benchmark's distributions, by name (all fixed: no randomness outside `sample`)."""
    rng = np.random.default_rng(1234)  # only for the 16-D mixture's centers, scales and weights
    centers16 = rng.standard_normal((10, 16))
    weights16 = rng.dirichlet(np.full(10, 5.0))
    unequal_weights = np.array([0.5] + [0.1] * 3 + [0.025] * 8)
    sets = [
        Distribution(
            "ring_clusters",
            "issue 10's example: a thin ring (radius 2, std 0.02) and 12 small clusters (std 0.04)",
            [
                Rings(np.zeros((1, 2)), np.array([2.0]), np.array([0.02]), np.array([1.0])),
                Clusters(
                    np.concatenate([_circle(6, 1.0), _circle(6, 3.0, np.pi / 6)]),
                    np.full(12, 0.04),
                    np.full(12, 1 / 12),
                ),
            ],
            [0.4, 0.6],
        ),  # fmt: skip
        Distribution(
            "thin_rings",
            "3 concentric rings, radii 1, 2, 3, radial std 0.02 (each ring 8 arc modes)",
            [Rings(np.zeros((3, 2)), np.array([1.0, 2.0, 3.0]), np.full(3, 0.02), np.array([1, 2, 3]) / 6)],
            [1.0],
        ),
        Distribution(
            "many_clusters",
            "36 small clusters on a 6x6 grid, spacing 1, std 0.03",
            [Clusters(_grid(6, 1.0), np.full(36, 0.03), np.full(36, 1 / 36))],
            [1.0],
        ),
        Distribution(
            "spiral_curve",
            "a 1-D curve: the spiral r = theta / 2pi over 2.25 turns, std 0.01 (12 segment modes)",
            [Spiral(np.pi / 2, 5 * np.pi, 0.01)],
            [1.0],
        ),
        Distribution(
            "unequal_clusters",
            "1 big cluster (std 1, 50%), 3 medium (std 0.25, 10% each), 8 tiny (std 0.03, 2.5% each)",
            [
                Clusters(
                    np.concatenate([np.zeros((1, 2)), _circle(3, 4.5, 0.3), _circle(8, 6.5)]),
                    np.array([1.0] + [0.25] * 3 + [0.03] * 8),
                    unequal_weights,
                )
            ],
            [1.0],
        ),  # fmt: skip
        Distribution(
            "heavy_spokes",
            "8 thin spokes, radius 1 + Lomax(1.5) (infinite variance; max of 20k ~ 700), width 0.03 x radius",
            [Spokes(8, 1.5, 0.03)],
            [1.0],
        ),
        Distribution(
            "mixture_16d",
            "10 Gaussians in 16-D, centers N(0, I), std 0.05..0.2, Dirichlet(5) weights",
            [Clusters(centers16, np.geomspace(0.05, 0.2, 10), weights16)],
            [1.0],
        ),
    ]
    return {d.name: d for d in sets}
