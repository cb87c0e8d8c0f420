"""Per-model calibration of the token estimate from what the upstream reports.

When a response carries `usage.prompt_tokens` for a request whose estimate we know, the ratio
moves the model's factor (an exponential moving average, clamped). A context-length error pushes
the factor up at once, so the retry and the next requests estimate closer to the upstream.
"""

from __future__ import annotations

from collections import OrderedDict

# Under-counting risks an overflow, over-counting only wastes room: allow little of the former.
_MIN_FACTOR = 0.8
_MAX_FACTOR = 4.0
_WEIGHT = 0.3
_MAX_MODELS = 1024


class Calibration:
    def __init__(self, max_models: int = _MAX_MODELS) -> None:
        self._max_models = max_models
        self._factors: OrderedDict[str, float] = OrderedDict()
        self.max_factor = 1.0
        """The largest factor of any model (at least 1): the byte bound uses it per request."""

    def factor(self, model: str) -> float:
        return self._factors.get(model, 1.0)

    def observe(self, model: str, estimated: int, actual: int) -> float:
        """Fold one (raw estimate, upstream count) pair into the model's factor; return it."""
        if estimated <= 0 or actual <= 0:
            return self.factor(model)
        observed = actual / estimated
        current = self._factors.get(model)
        factor = observed if current is None else current + _WEIGHT * (observed - current)
        return self._set(model, factor)

    def raise_at_least(self, model: str, factor: float) -> float:
        """After an overflow: the factor becomes at least `factor` (never lowered here)."""
        return self._set(model, max(self.factor(model), factor))

    def _set(self, model: str, factor: float) -> float:
        factor = min(_MAX_FACTOR, max(_MIN_FACTOR, factor))
        self._factors[model] = factor
        self._factors.move_to_end(model)
        while len(self._factors) > self._max_models:
            self._factors.popitem(last=False)
        self.max_factor = max(1.0, *self._factors.values())
        return factor
