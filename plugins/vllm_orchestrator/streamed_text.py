"""A streamed reply's text, decoded as its ids arrive and cut at the first stop string."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


class StreamedText:
    """The text to show as a trajectory's ids arrive, run by run.

    Decoding the whole trajectory at each run would be quadratic: a reply of 30k tokens streamed
    token by token would decode some 450M tokens. This decodes a short window instead: the new ids
    and the run before them, whose text is known, because a token's text can depend on the one
    before it (a character split over byte tokens). Text is shown only when it is final: a window
    ending in a partial character waits for the rest, and the last ``len(longest stop) - 1``
    characters wait until no stop string can start in them.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], skip: Iterable[int], stop: Sequence[str]):
        self.decode = decode
        self.skip = frozenset(skip)
        self.stop = tuple(stop)
        self.hold = max(map(len, self.stop), default=1) - 1
        self.ids: list[int] = []
        self.start = 0  # the window starts here: ids[start:read] are the run before the new ids
        self.read = 0  # the text of ids[:read] is known
        self.pending = ""  # known text not shown yet: no stop string starts before it
        self.stopped = False

    def add(self, ids: Iterable[int]) -> str:
        """The text that may be shown now that ``ids`` came (maybe none)."""
        if self.stopped:
            return ""
        self.ids.extend(t for t in ids if t not in self.skip)
        known = self.decode(self.ids[self.start : self.read])
        window = self.decode(self.ids[self.start :])
        if window.endswith("\ufffd") or not window.startswith(known):
            return ""  # a character still arriving: the window grows until it is whole
        self.pending += window[len(known) :]
        self.start, self.read = self.read, len(self.ids)
        return self._release(keep=self.hold)

    def finish(self) -> str:
        """The rest, once no more ids come."""
        if self.stopped:
            return ""
        known = self.decode(self.ids[self.start : self.read])
        self.pending += self.decode(self.ids[self.start :])[len(known) :]
        return self._release(keep=0)

    def _release(self, keep: int) -> str:
        ends = [i for s in self.stop if (i := self.pending.find(s)) >= 0]
        if ends:
            self.pending, self.stopped, keep = self.pending[: min(ends)], True, 0
        cut = max(0, len(self.pending) - keep)
        shown, self.pending = self.pending[:cut], self.pending[cut:]
        return shown
