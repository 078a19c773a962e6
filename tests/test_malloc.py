"""``keep_freed_memory``: while training, glibc serves a big block from its heap and keeps it
there once freed; afterwards its defaults are back.

Read off glibc's own accounting (``mallinfo2``), in a fresh interpreter for each case, as
``threadweaver sft`` runs, so the setting does not leak into the test process. (Counting page
faults instead was not deterministic: small allocations made between two big ones can keep a
freed block from being reused as it is.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BIG_BLOCK = """
import ctypes, ctypes.util
import torch
from threadweaver.hf_collator.malloc import keep_freed_memory

FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Mallinfo2

def big_block():  # (MiB mapped for a live 64 MiB block, MiB of free heap kept once it is freed)
    before = libc.mallinfo2()
    block = torch.ones(64 * 2**20 // 4)  # above glibc's largest mmap threshold (32 MiB)
    live = libc.mallinfo2()
    del block
    freed = libc.mallinfo2()
    # To the nearest MiB: the interpreter's own small allocations in between move the free heap by a few
    # KiB either way (truncated, 64 MiB kept once read 63).
    return round((live.hblkhd - before.hblkhd) / 2**20), round((freed.fordblks - before.fordblks) / 2**20)

with keep_freed_memory() as told:
    inside = big_block()
print(told, *inside, *big_block())
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt and mallinfo2 are glibc's")


def big_block(env: dict[str, str]) -> tuple[bool, int, int, int, int]:
    """(told; MiB mapped for a live block and MiB kept once freed, inside the block, then after it)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", BIG_BLOCK], env={**clean, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    told, *mib = done.stdout.split()
    return (told == "True", *map(int, mib))


def test_while_training_a_big_block_comes_from_the_heap_and_stays_there_once_freed():
    told, mapped, kept, mapped_after, kept_after = big_block({})
    assert (told, mapped, kept) == (True, 0, 64)
    assert (mapped_after, kept_after) == (64, 0)  # afterwards glibc's defaults, and nothing was held back


def test_a_user_who_set_malloc_variables_is_left_alone():
    assert big_block({"MALLOC_MMAP_MAX_": "65536"}) == (False, 64, 0, 64, 0)  # glibc's default: mapped, unmapped
