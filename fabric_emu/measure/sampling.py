"""Background samplers that run while the traffic phase does (CPU use, queue depths)."""

from __future__ import annotations

import threading
from collections.abc import Iterator


class Sampler:
    """Runs ticks() in a daemon thread between __enter__ and __exit__: the body of each
    iteration of ticks() is one sample, taken every interval_s until the phase ends."""

    interval_s: float = 0.5

    def ticks(self) -> Iterator[None]:
        raise NotImplementedError

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        for _ in self.ticks():
            if self._stop.wait(self.interval_s):
                return
