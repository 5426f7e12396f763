"""Acceptance counts that fade with age: the evidence a length policy (:mod:`.policy`) plans
on, per draft position or confidence bin."""

from __future__ import annotations

import numpy as np


class Decayed:
    """Acceptance counts per bucket that fade with age, shrunk towards a prior.

    ``rates(prior)`` returns (accepted + s·prior) / (tested + s) per bucket, so a bucket with
    little recent evidence falls back to the prior (a scalar or one value per bucket).
    ``rates(prior, z)`` adds z standard errors: an optimistic estimate while evidence is thin.
    """

    def __init__(self, n: int, strength: float):
        self.tested = np.zeros(n)
        self.accepted = np.zeros(n)
        self.strength = strength

    def rates(self, prior, z: float = 0.0) -> np.ndarray:
        """Shrunk rates, raised by ``z`` standard errors (an upper confidence bound)."""
        s = self.strength
        n = self.tested + s
        r = (self.accepted + s * np.asarray(prior)) / n
        return np.minimum(1.0, r + z * np.sqrt(r * (1 - r) / n)) if z else r

    def pooled(self, prior: float) -> float:
        s = self.strength
        return float((self.accepted.sum() + s * prior) / (self.tested.sum() + s))

    def add(self, bucket: int, accepted: bool) -> None:
        self.tested[bucket] += 1
        self.accepted[bucket] += accepted

    def age(self, decay: float) -> None:
        self.tested *= decay
        self.accepted *= decay

    def cap(self, most: float) -> None:
        """At most ``most`` tests' weight in each bucket, its rate kept."""
        scale = np.minimum(1.0, most / np.maximum(self.tested, 1e-12))
        self.tested *= scale
        self.accepted *= scale
