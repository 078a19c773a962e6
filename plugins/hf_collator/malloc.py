"""Keep freed memory in glibc's heap while training on CPU.

TRL's fused LM head works on CPU in tiles of up to [4096, vocabulary] floats, fresh each
step (a profile's reading, ``bench/RESULTS.md``). glibc serves blocks that big with
``mmap`` and unmaps them when they are freed, so every step faults the same pages in again:
on ``bench/pretrained.py``'s parallel batches a profile counted 2.4M page faults and 4 s of
system time a step. Told never to ``mmap`` and never to trim, glibc reuses that memory
instead (``bench/RESULTS.md`` has the measurement) while the block is open; at its end glibc's
defaults come back and the kept memory is returned (``malloc_trim``), so a process that goes
on after training (the quickstart) does not hold its training peak.

A user who sets any ``MALLOC_*`` variable has tuned glibc themselves and is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
"""``mallopt`` parameters, from glibc's ``malloc.h``."""
DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}
KEEP = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_MAX: 0}


def _glibc():
    """glibc, or None where malloc is another's (musl has no ``mallopt``) or the user tuned it."""
    if any(name.startswith("MALLOC_") for name in os.environ):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextlib.contextmanager
def keep_freed_memory():
    """Within the block, glibc keeps freed memory for reuse; yields whether it was told to."""
    libc = _glibc()
    told = libc is not None and all(libc.mallopt(param, value) == 1 for param, value in KEEP.items())
    if told:
        logger.info("glibc keeps freed memory for reuse while training (set MALLOC_MMAP_MAX_ to opt out)")
    try:
        yield told
    finally:
        if told:
            for param, value in DEFAULTS.items():
                libc.mallopt(param, value)
            libc.malloc_trim(0)
