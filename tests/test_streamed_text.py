"""The streamed text of a reply equals the text of its ids decoded whole, however the ids come."""

from __future__ import annotations

import random

import pytest

from threadweaver.format import Format
from threadweaver.vllm_orchestrator.streamed_text import StreamedText

TEXT = (
    "<Parallel><Outlines><Outline>1: 12 × 3 — café</Outline></Outlines>"
    "<Thread>1: 十二乘三 is 36 🙂🙂</Thread><Thread>2: naïve check: 36 ✓</Thread></Parallel> so 36 🫠. STOP here, ok 龘"
)


def streamed(text: StreamedText, ids: list[int], rng: random.Random) -> str:
    pieces, at = [], 0
    while at < len(ids):
        run = rng.randint(1, 4)
        pieces.append(text.add(ids[at : at + run]))
        at += run
    return "".join(pieces) + text.finish()


@pytest.mark.parametrize("stop", [(), ("STOP",), ("✓</Thread>", "zzz"), ("🙂🙂",), ("never",)])
def test_runs_of_any_size_give_the_whole_text_cut_at_the_first_stop(qwen, stop):
    fmt = Format.from_tokenizer(qwen)
    ids = fmt.encode(TEXT) + list(fmt.eos_ids)[:1]
    whole = fmt.decode(ids[:-1])
    ends = [whole.index(s) for s in stop if s in whole]
    expected = whole[: min(ends)] if ends else whole
    rng = random.Random(0)
    for _ in range(50):
        text = StreamedText(fmt.decode, fmt.eos_ids, stop)
        assert streamed(text, ids, rng) == expected
        assert text.stopped == bool(ends)


def test_a_character_is_shown_whole_and_stop_strings_are_waited_for(qwen):
    fmt = Format.from_tokenizer(qwen)
    ids = fmt.encode("a 🫠b")
    assert [fmt.decode([t]) for t in ids] == ["a", " \ufffd", "\ufffd", "\ufffd", "b"]  # 🫠 is three byte tokens
    text = StreamedText(fmt.decode, (), ())
    assert [text.add([t]) for t in ids] + [text.finish()] == ["a", "", "", " 🫠", "b", ""]
    text = StreamedText(fmt.decode, (), ("zz",))  # a last character might start "zz": it waits for the next
    assert [text.add([t]) for t in ids] + [text.finish()] == ["", "", "", "a ", "🫠", "b"]


def test_each_id_is_decoded_a_bounded_number_of_times(qwen):
    """Linear, not quadratic: token by token, a long reply is not decoded whole at each token."""
    fmt = Format.from_tokenizer(qwen)
    ids = fmt.encode(TEXT * 40)
    decoded = 0

    def counting(run):
        nonlocal decoded
        decoded += len(run)
        return fmt.decode(run)

    text = StreamedText(counting, (), ("never",))
    shown = "".join(text.add([t]) for t in ids) + text.finish()
    assert shown == fmt.decode(ids)
    assert decoded < 8 * len(ids)
