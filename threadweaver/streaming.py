"""A trajectory's tokens in their final order, released as soon as everything before them is final.

The orchestrator decodes a block's threads at the same time, but the trajectory reads
thread 1, then thread 2: what thread 2 decodes waits until thread 1 (with any block nested
in it) is done. Each sequence writes to its :class:`Part`; a block's threads are child parts
in order. ``emit`` receives each run of ids once, in trajectory order, so the runs
concatenated are exactly the trajectory's ``token_ids``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Part:
    """The tokens of one sequence, or of one thread with its ``<Thread>``, seed and ``</Thread>``."""

    def __init__(self, stream: OrderedStream):
        self.stream = stream
        self.items: list[tuple[int, ...] | Part] = []
        self.sent = 0
        """Items released so far."""
        self.done = False

    def add(self, ids: Sequence[int]) -> None:
        """Final ids at the end of this part."""
        if ids:
            self.items.append(tuple(ids))
            self.stream.flush()

    def child(self) -> Part:
        """A part that lies here: what comes after it waits until it is closed."""
        part = Part(self.stream)
        self.items.append(part)
        return part

    def close(self) -> None:
        self.done = True
        self.stream.flush()


class OrderedStream:
    def __init__(self, emit: Callable[[tuple[int, ...]], None] | None = None):
        """``emit``: called with each run of ids, in order (None: nothing is streamed)."""
        self.emit = emit
        self.root = Part(self)

    def flush(self) -> None:
        if self.emit is not None:
            self._flush(self.root)

    def _flush(self, part: Part) -> bool:
        """Release what ``part`` can; True when all of it is released and it is closed."""
        while part.sent < len(part.items):
            item = part.items[part.sent]
            if isinstance(item, Part):
                if not self._flush(item):
                    return False
            else:
                self.emit(item)
            part.sent += 1
        return part.done
