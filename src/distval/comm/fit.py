"""The α–β (latency–bandwidth) model of one collective: t(S) = α + S/β.

Fitted by weighted least squares with weights 1/t², i.e. minimising *relative* residuals, so the
latency-bound small sizes (which pin α) and the bandwidth-bound large sizes (which pin β) count
alike; an unweighted fit lets the largest size decide everything and leaves α at noise level,
often negative. α is constrained to be ≥ 0 (a negative latency is unphysical: when the free fit
gives one, the model is refitted through the origin). A noisy sweep (a loaded host: one size
timed far off its neighbours) can leave least squares with no positive slope; then the slope is
Theil–Sen's, the median of the slopes between every two sizes, which one or two stray points do
not move, and α the median of t − S/β (never below 0). R² is the weighted coefficient of
determination of the fit returned, so a fit of a noisy sweep says so by its low R². The
half-performance size n½ = α·β is where the model reaches half of its asymptotic bandwidth β
(Hockney).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float
    beta_bytes_per_s: float
    r2: float
    num_points: int

    @property
    def alpha_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def beta_gbps(self) -> float:
        return self.beta_bytes_per_s / 1e9

    @property
    def n_half_bytes(self) -> float:
        return self.alpha_s * self.beta_bytes_per_s

    def time_s(self, size_bytes: float) -> float:
        return self.alpha_s + size_bytes / self.beta_bytes_per_s


def fit_alpha_beta(size_bytes: list[float], time_s: list[float]) -> AlphaBeta | None:
    """Fit over the points with S > 0 and t > 0; None when fewer than two distinct sizes remain
    or the data show no positive bandwidth (neither by least squares nor by Theil–Sen)."""
    pts = [(s, t) for s, t in zip(size_bytes, time_s) if s > 0 and t > 0]
    if len({s for s, _ in pts}) < 2:
        return None
    s = np.array([p[0] for p in pts], dtype=np.float64)
    t = np.array([p[1] for p in pts], dtype=np.float64)
    alpha, inv_beta = least_squares(s, t)
    if inv_beta <= 0:
        inv_beta = float(np.median([(t[j] - t[i]) / (s[j] - s[i]) for i in range(len(s)) for j in range(len(s))
                                    if s[j] > s[i]]))
        if inv_beta <= 0:
            return None
        alpha = max(0.0, float(np.median(t - inv_beta * s)))
    weights = 1.0 / (t * t)
    pred = alpha + inv_beta * s
    t_mean = float(np.sum(weights * t) / np.sum(weights))
    ss_tot = float(np.sum(weights * (t - t_mean) ** 2))
    r2 = 1.0 - float(np.sum(weights * (t - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return AlphaBeta(float(alpha), 1.0 / float(inv_beta), r2, len(pts))


def least_squares(s: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(α, 1/β) of the 1/t²-weighted least squares over sizes `s` and times `t`, α clamped at 0
    (then refitted through the origin); 1/β may come out ≤ 0 on a noisy sweep."""
    w = 1.0 / t  # sqrt of the 1/t² weights: rows scaled by 1/t make residuals relative
    design = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if alpha < 0:
        return 0.0, float(np.sum(w * w * s * t) / np.sum(w * w * s * s))
    return float(alpha), float(inv_beta)
