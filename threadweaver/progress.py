"""Progress of long work: a tqdm bar on a terminal, and a plain line now and then in a log.

A bar redraws itself with carriage returns, which a log file (a job scheduler's, ``nohup``'s, a
pipe's) keeps as one ever longer line, so the commands used to show no progress there at all.
Where standard error is not a terminal, :func:`progress_bar` writes what the bar would show as a
line of its own every :data:`LOG_EVERY_S` seconds, and a last line when the work ends, if it wrote
any: work shorter than that writes nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

LOG_EVERY_S = 30.0
WITH_TOTAL = "{desc}: {percentage:.0f}% {n_fmt}/{total_fmt}{unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str):
    """A bar over ``iterable`` (or updated by hand, up to ``total``): ``update(n)``, ``set_postfix_str(s)``,
    ``close()``, and use as a context manager, as tqdm's."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return LogLines(iterable, total, desc, unit, LOG_EVERY_S)


class LogLines:
    """tqdm's interface, as lines: ``desc: 40% 400/1000 rows [00:30<00:45, 13.3 rows/s, postfix]``."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str, unit: str, every_s: float):
        self.iterable, self.total, self.desc, self.unit, self.every_s = iterable, total, desc, unit, every_s
        self.n, self.postfix, self.written = 0, "", None  # ``written``: n at the last line written
        self.start = self.last = time.monotonic()

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._write(now)

    def set_postfix_str(self, postfix: str) -> None:
        self.postfix = postfix

    def close(self) -> None:
        if self.written is not None and self.written != self.n:  # a log that showed the work shows where it ended
            self._write(time.monotonic())

    def _write(self, now: float) -> None:
        from tqdm import tqdm

        line = tqdm.format_meter(
            self.n,
            self.total,
            now - self.start,
            prefix=self.desc,
            unit=self.unit,
            postfix=self.postfix or None,
            bar_format=None if self.total is None else WITH_TOTAL,
        )
        print(line, file=sys.stderr, flush=True)
        self.written = self.n
