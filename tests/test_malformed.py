"""Strict parsing names the position and tag of the first fault; lenient parsing never raises, but for
blocks nested past Python's recursion limit under a max_depth as deep, which both modes name as a format
error."""

import pytest
from chars import EOS

from threadweaver.tree import Block, TrajectoryFormatError, parse

O1, O2 = "<Outline>1:a</Outline>", "<Outline>2:b</Outline>"
HEAD1 = f"<Parallel><Outlines>{O1}</Outlines>"
HEAD2 = f"<Parallel><Outlines>{O1}{O2}</Outlines>"

# (text, tag at the fault, words in the message, whether lenient parsing keeps a block)
CASES = [
    ("<Thread>1:a</Thread>", "<Thread>", "outside", False),
    ("abc</Parallel>", "</Parallel>", "outside", False),
    ("x<Outline>1:a</Outline>", "<Outline>", "outside", False),
    (f"{HEAD1}<Thread>1:b</Thread>", "end of output", "expected </Parallel> after thread 1", False),
    (
        "<Parallel><Outlines><Outline>2:a</Outline></Outlines><Thread>2:b</Thread></Parallel>",
        "<Outline>",
        "outline 1 has number 2",
        False,
    ),
    (
        "<Parallel><Outlines><Outline>abc</Outline></Outlines><Thread>1:b</Thread></Parallel>",
        "<Outline>",
        "outline 1 has no number",
        False,
    ),
    (f"{HEAD2}<Thread>1:x</Thread></Parallel>", "</Parallel>", "expected <Thread> 2", False),
    (
        f"{HEAD1}<Thread>1:x</Thread><Thread>2:y</Thread></Parallel>",
        "<Thread>",
        "more threads than the 1 outlines",
        False,
    ),
    (f"{HEAD1}<Thread>1:</Thread></Parallel>", "</Thread>", "thread 1 is empty", True),
    (f"{HEAD1}<Thread>1:abc", "end of output", "thread 1 never closes", False),
    ("<Parallel><Outlines></Outlines><Thread>1:a</Thread></Parallel>", "</Outlines>", "at least one outline", False),
    ("<Parallel><Thread>1:a</Thread></Parallel>", "<Thread>", "expected <Outlines>", False),
    ("<Parallel><Outlines><Outline>1:a</Outlines>", "</Outlines>", "not closed by </Outline>", False),
    ("<Parallel><Outlines><Thread>1:a</Thread></Outlines>", "<Thread>", "only <Outline> entries", False),
    (f"{HEAD1}<Thread>2:a</Thread></Parallel>", "<Thread>", "does not start with its seed 1:", False),
    (f"{HEAD2}<Thread>1:x</Thread>zz<Thread>2:y</Thread></Parallel>", None, "expected <Thread> 2", False),
    (f"{HEAD1}<Thread>1:x</Parallel></Thread></Parallel>", "</Parallel>", "outside", True),
    (
        f"{HEAD1}<Thread>1:{HEAD1}<Thread>1:y</Thread></Parallel></Thread></Parallel>",
        "<Parallel>",
        "nested 2 deep; max_depth is 1",
        True,
    ),
]


@pytest.mark.parametrize("text,tag,message,keeps_block", CASES)
def test_strict_names_position_and_tag(fmt, text, tag, message, keeps_block):
    ids = fmt.encode(text)
    with pytest.raises(TrajectoryFormatError) as err:
        parse(ids, fmt, strict=True, max_depth=1)
    assert err.value.tag == tag
    assert message in str(err.value)
    assert str(err.value).startswith(f"token {err.value.position}")
    if tag not in (None, "end of output"):
        assert fmt.tag_name(ids[err.value.position]) == tag


@pytest.mark.parametrize("text,tag,message,keeps_block", CASES)
def test_lenient_never_raises_and_loses_nothing(fmt, text, tag, message, keeps_block):
    ids = fmt.encode(text)
    parsed = parse(ids, fmt, strict=False, max_depth=1)
    assert parsed.faults and not parsed.well_formed
    assert any(message in str(p) for p in parsed.faults)
    from threadweaver.layout import render

    assert render(parsed.nodes, fmt) == ids
    assert any(isinstance(n, Block) for n in parsed.nodes) == keeps_block


def test_eos_inside_a_thread(fmt):
    ids = fmt.encode(f"{HEAD1}<Thread>1:a") + [EOS] + fmt.encode("b</Thread></Parallel>")
    with pytest.raises(TrajectoryFormatError, match="end-of-sequence token inside thread 1"):
        parse(ids, fmt)
    assert parse(ids, fmt, strict=False).faults[0].position == ids.index(EOS)


def test_a_broken_nested_block_keeps_the_outer_block(fmt):
    inner_broken = "<Parallel><Outlines><Outline>1:q</Outline></Outlines>"  # never spawns its thread
    ids = fmt.encode(f"{HEAD1}<Thread>1:{inner_broken}z</Thread></Parallel>")
    parsed = parse(ids, fmt, strict=False)
    assert isinstance(parsed.nodes[0], Block)
    assert len(parsed.faults) == 1 and "expected <Thread> 1" in str(parsed.faults[0])


def test_lenient_faults_of_a_failed_block_are_not_counted_twice(fmt):
    ids = fmt.encode(f"{HEAD1}<Thread>1:</Thread>")  # empty thread, then no </Parallel>
    messages = [p.message for p in parse(ids, fmt, strict=False).faults]
    assert messages.count("thread 1 is empty") == 0
    assert any("expected </Parallel>" in m for m in messages)


def test_lenient_keeps_an_over_deep_block_as_text_inside_its_thread(fmt):
    inner = f"{HEAD1}<Thread>1:y</Thread></Parallel>"
    ids = fmt.encode(f"{HEAD1}<Thread>1:{inner}z</Thread></Parallel>")
    parsed = parse(ids, fmt, strict=False, max_depth=1)
    (block,) = parsed.nodes
    assert [type(n).__name__ for n in block.threads[0].body] == ["Text"]
    assert block.threads[0].body[0].ids == tuple(fmt.encode(inner + "z"))
    assert [p.message.endswith("kept as sequential text") for p in parsed.faults] == [True]


@pytest.mark.parametrize("strict", [True, False])
def test_blocks_nested_past_the_recursion_limit_are_a_format_error_not_a_crash(fmt, strict):
    depth = 400
    ids = fmt.encode(f"{HEAD1}<Thread>1:" * depth + "x" + "</Thread></Parallel>" * depth)
    with pytest.raises(TrajectoryFormatError, match="blocks nested too deep to read") as caught:
        parse(ids, fmt, strict=strict, max_depth=depth)
    opening = len(fmt.encode(f"{HEAD1}<Thread>1:" * depth))
    assert 0 < caught.value.position < opening and caught.value.tag is not None  # where it gave up, going down


def test_lenient_past_max_depth_reads_a_row_nested_a_thousand_deep_without_descending(fmt):
    depth = 1000
    ids = fmt.encode(f"{HEAD1}<Thread>1:" * depth + "x" + "</Thread></Parallel>" * depth)
    parsed = parse(ids, fmt, strict=False, max_depth=3)
    from threadweaver.layout import render

    assert render(parsed.nodes, fmt) == ids
    assert [str(f).split(": ", 1)[1] for f in parsed.faults] == [
        "parallel block nested 4 deep; max_depth is 3: kept as sequential text"
    ]


@pytest.mark.parametrize(
    "text",
    [f"{HEAD1}<Thread>1:x</Thread><Thread>2:y</Thread></Parallel>", "<Parallel><Outlines></Outlines></Parallel>"],
    ids=["more threads", "no outline"],
)
def test_a_failed_block_names_its_fault_once_not_its_tag_again_as_stray(fmt, text):
    faults = parse(fmt.encode(text), fmt, strict=False).faults
    positions = [f.position for f in faults]
    assert len(set(positions)) == len(positions) and "outside the place" not in faults[0].message


@pytest.mark.parametrize("number", ["01", "\u0661", "\uff11"], ids=["leading zero", "arabic-indic", "fullwidth"])
def test_a_number_not_written_as_the_orchestrator_writes_it_is_kept_as_written_and_judged(qwen, number):
    """``Format.encode`` rewrote ``<Thread>01:`` as the seed ``1:``, and ``١:`` (int() reads any digit) too:
    the training text silently changed, and the row passed as well-formed."""
    from threadweaver.format import Format

    fmt = Format.from_tokenizer(qwen)
    text = f"<Parallel><Outlines><Outline>{number}:a</Outline></Outlines><Thread>{number}:x</Thread></Parallel>"
    assert fmt.decode(fmt.encode(text)) == text
    faults = parse(fmt.encode(text), fmt, strict=False).faults
    assert faults[0].message == "outline 1 has no number; outlines are numbered 1, 2, ... in order"
    with pytest.raises(TrajectoryFormatError, match="thread 1 does not start with its seed 1:"):
        parse(fmt.encode(text.replace(f"<Outline>{number}:", "<Outline>1:")), fmt)  # the thread's seed: not 1:


def test_an_unclosed_block_past_max_depth_ends_at_its_threads_close_and_keeps_the_outer_block(fmt):
    """Found by review: the text of a too-deep block that never closes ran past the ``</Thread>`` of the thread
    it stood in, so that thread never closed and the whole outer block became text."""
    from threadweaver.layout import render

    ids = fmt.encode(f"{HEAD1}<Thread>1:x<Parallel>y</Thread></Parallel>tail")
    parsed = parse(ids, fmt, strict=False, max_depth=1)
    assert [type(n).__name__ for n in parsed.nodes] == ["Block", "Text"] and render(parsed.nodes, fmt) == ids
    assert [f.message for f in parsed.faults] == [
        "parallel block nested 2 deep; max_depth is 1: kept as sequential text"
    ]
