"""The rate limiter: Reverb's ``SampleToInsertRatio``, which keeps the items sampled per item
inserted near a target. It only counts; the replay server decides what to hold back
(``ReplayService.drain``). Whether a limiter can hold back a chunk and a batch at once, forever,
is ``check_no_deadlock`` (the config's rule: ``config_rules.check_rate_limiter_slack``).
"""

from __future__ import annotations

import math

from apexrl.config.rules import check_rate_limiter_slack


class RateLimiter:
    """Keeps samples per insert near a target ratio (Reverb's ``SampleToInsertRatio``).

    It counts items, not calls. With ``diff = num_inserted * samples_per_insert - num_sampled``:

    - inserting ``n`` is allowed while filling (``num_inserted + n <= min_size_to_sample``) or if
      ``diff + n * spi <= min_size_to_sample * spi + error_buffer``;
    - sampling ``n`` needs ``num_inserted >= min_size_to_sample`` and
      ``diff - n >= min_size_to_sample * spi - error_buffer``.

    So once sampling starts, ``|num_sampled - spi * (num_inserted - min_size_to_sample)|`` stays
    within ``error_buffer``. ``samples_per_insert <= 0`` disables the ratio: inserts are always
    allowed and sampling needs only ``min_size_to_sample`` inserts (for tests and benchmarks).

    Deadlock: if ``error_buffer`` is too small, a full insert chunk and a full batch can both be
    blocked at once and neither side ever moves. The replay server must choose
    ``error_buffer >= max(max_insert_items * spi, max_sample_items)``; ``check_no_deadlock`` checks
    it.
    """

    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float
    ) -> None:
        if not math.isfinite(samples_per_insert):
            raise ValueError(f"samples_per_insert must be finite, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        if not (math.isfinite(error_buffer) and error_buffer >= 0):
            raise ValueError(f"error_buffer must be finite and >= 0, got {error_buffer}")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.error_buffer = float(error_buffer)
        self._num_inserted = 0
        self._num_sampled = 0

    @property
    def num_inserted(self) -> int:
        return self._num_inserted

    @property
    def num_sampled(self) -> int:
        return self._num_sampled

    @property
    def diff(self) -> float:
        """``num_inserted * samples_per_insert - num_sampled``."""
        return self._num_inserted * self.samples_per_insert - self._num_sampled

    def can_insert(self, num_items: int) -> bool:
        spi = self.samples_per_insert
        if spi <= 0 or self._num_inserted + num_items <= self.min_size_to_sample:
            return True
        return self.diff + num_items * spi <= self.min_size_to_sample * spi + self.error_buffer

    def can_sample(self, num_items: int) -> bool:
        if self._num_inserted < self.min_size_to_sample:
            return False
        spi = self.samples_per_insert
        if spi <= 0:
            return True
        return self.diff - num_items >= self.min_size_to_sample * spi - self.error_buffer

    def record_insert(self, num_items: int) -> None:
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self._num_inserted += num_items

    def record_sample(self, num_items: int) -> None:
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self._num_sampled += num_items

    def restore(self, num_inserted: int, num_sampled: int) -> None:
        """Go on from counters saved earlier (a replay snapshot)."""
        for name, value in (("num_inserted", num_inserted), ("num_sampled", num_sampled)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
                raise ValueError(f"{name} must be an int in 0..2**62, got {value!r}")
        self._num_inserted, self._num_sampled = num_inserted, num_sampled


def check_no_deadlock(limiter: RateLimiter, max_insert_items: int, max_sample_items: int) -> None:
    """Raise ``ValueError`` unless inserts of up to ``max_insert_items`` and samples of up to
    ``max_sample_items`` can never be blocked at the same time: ``error_buffer >=
    max(max_insert_items * spi, max_sample_items)`` when the ratio is on (``spi > 0``), the
    config's rule ``check_rate_limiter_slack``."""
    spi = limiter.samples_per_insert
    if spi > 0:
        check_rate_limiter_slack(spi, limiter.error_buffer, max_insert_items, max_sample_items)
