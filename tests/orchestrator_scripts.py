"""Orchestrator scripts the core tests share (for threadweaver.testing.ScriptedEngine).

``GOOD`` decodes one well-formed block; ``NESTED`` a block nested in thread 1; ``CASES`` is a
table of malformed model outputs, each with the limits it runs under and the problem it
must record.
"""

from threadweaver.orchestrator import Limits

PROMPT = "Q?"
HEAD = "<Parallel><Outlines><Outline>1:a</Outline><Outline>2:b</Outline></Outlines>"
GOOD = {
    PROMPT: "think " + HEAD + " never reached",
    "<Thread>1:": "aa</Thread>",
    "<Thread>2:": "bbbb</Thread>",
    "</Parallel>": " done<EOS>",
}
WELL_FORMED = "think " + HEAD + "<Thread>1:aa</Thread><Thread>2:bbbb</Thread></Parallel> done"

INNER = "<Thread>1:x<Parallel><Outlines><Outline>1:c</Outline><Outline>2:d</Outline></Outlines>"
NESTED = {
    **GOOD,
    "<Thread>1:": INNER[len("<Thread>1:") :],
    INNER + "<Thread>1:": "cccccccccc</Thread>",
    INNER + "<Thread>2:": "d</Thread>",
    "<Thread>2:d</Thread></Parallel>": "y</Thread>",
}
DEEP = "<Parallel><Outlines><Outline>1:c</Outline></Outlines>"
"""A block head with one outline, to nest inside a thread."""


def head(*outlines: str) -> str:
    return "<Parallel><Outlines>" + "".join(f"<Outline>{o}</Outline>" for o in outlines) + "</Outlines>"


def bad_head(text: str) -> dict:
    """The main sequence writes ``text`` (ending in </Outlines>), then goes on plainly."""
    return {PROMPT: "t " + text, text: " plain<EOS>"}


def with_threads(one: str, two: str = "bbbb</Thread>", **more) -> dict:
    return dict(GOOD, **{"<Thread>1:": one, "<Thread>2:": two}, **more)


CASES = {
    "duplicate outline numbers": (bad_head(head("1:a", "1:b")), Limits(), "outline 2 has number 1"),
    "a gap in the numbers": (bad_head(head("1:a", "3:b")), Limits(), "outline 2 has number 3"),
    "numbers start at 2": (bad_head(head("2:a", "3:b")), Limits(), "outline 1 has number 2"),
    "number zero": (bad_head(head("0:a")), Limits(), "outline 1 has number 0"),
    "no number": (bad_head(head("a")), Limits(), "outline 1 has no number"),
    "a word for a number": (bad_head(head("one:a")), Limits(), "outline 1 has no number"),
    "no outlines": (bad_head(head()), Limits(), "at least one outline"),
    "an outline never closes": (
        bad_head("<Parallel><Outlines><Outline>1:a<Outline>2:b</Outline></Outlines>"),
        Limits(),
        "outline 1 is not closed",
    ),
    "text beside the outlines": (
        bad_head("<Parallel><Outlines>x<Thread>1:a</Outlines>"),
        Limits(),
        "only <Outline> entries",
    ),
    "no <Outlines>": (bad_head("<Parallel><Outline>1:a</Outline></Outlines>"), Limits(), "<Outlines> after"),
    "</Outlines> without <Parallel>": (
        bad_head("<Outlines><Outline>1:a</Outline></Outlines>"),
        Limits(),
        "without <Parallel>",
    ),
    "<Parallel> inside an outline": (
        bad_head("<Parallel><Outlines><Outline>1:<Parallel>a</Outline></Outlines>"),
        Limits(),
        "malformed outlines",
    ),
    "too many threads": (bad_head(HEAD), Limits(max_threads=1), "exceed max_threads=1"),
    "EOS inside a thread": (with_threads("aa<EOS>"), Limits(), "thread 1: end-of-sequence token"),
    "a thread never closes": (
        with_threads("a" * 40),
        Limits(max_request_tokens=30),
        "thread 1: stopped by the length limit",
    ),
    "a thread runs out of the trajectory budget": (
        with_threads("a" * 60),
        Limits(max_tokens=60),
        "stopped by the length limit",
    ),
    "an empty thread": (with_threads("</Thread>"), Limits(), "thread 1: the thread is empty"),
    "</Parallel> in the main text": ({PROMPT: "x</Parallel>y<EOS>"}, Limits(), "main sequence: stray </Parallel>"),
    "<Thread> in the main text": ({PROMPT: "x<Thread>1:y<EOS>"}, Limits(), "main sequence: stray <Thread>"),
    "</Thread> in the main text": ({PROMPT: "x</Thread>y<EOS>"}, Limits(), "main sequence: stray </Thread>"),
    "<Outline> in the main text": (
        {PROMPT: "x<Outline>1:y</Outline><EOS>"},
        Limits(),
        "main sequence: stray <Outline>, </Outline>",
    ),
    "EOS in an unfinished head": (
        {PROMPT: "x<Parallel><Outlines><Outline>1:a<EOS>"},
        Limits(),
        "main sequence: stray <Parallel>, <Outlines>, <Outline>",
    ),
    "an abandoned <Parallel> before a block": (
        dict(GOOD, **{PROMPT: "<Parallel>x " + HEAD}),
        Limits(),
        "main sequence: stray <Parallel>",
    ),
    "</Parallel> inside a thread": (with_threads("a</Parallel>a</Thread>"), Limits(), "thread 1: stray </Parallel>"),
    "the model opens a thread inside a thread": (
        with_threads("x<Thread>y</Thread>", **{"y</Thread>": "z</Thread>"}),
        Limits(),
        "thread 1: stray <Thread>, </Thread>",
    ),
    "a bad head inside a thread": (
        with_threads("x<Parallel><Outlines></Outlines>", **{"<Outlines></Outlines>": "y</Thread>"}),
        Limits(),
        "thread 1, block 1: malformed outlines",
    ),
    "</Outlines> without <Parallel> inside a thread": (
        with_threads("x<Outlines></Outlines>", **{"x<Outlines></Outlines>": "y</Thread>"}),
        Limits(),
        "thread 1, block 1: </Outlines> without <Parallel>",
    ),
    "EOS inside a nested thread": (
        with_threads("x" + DEEP, **{DEEP + "<Thread>1:": "c<EOS>", "</Parallel>": "y</Thread>"}),
        Limits(),
        "thread 1.1: end-of-sequence token",
    ),
    "nesting too deep": (
        with_threads("x" + DEEP, **{DEEP: "<Thread>1:cc</Thread>", "cc</Thread>": "</Parallel>y</Thread>"}),
        Limits(max_depth=1),
        "nested 2 deep, over max_depth=1",
    ),
    "a nested thread never closes": (
        with_threads("x" + DEEP, **{DEEP + "<Thread>1:": "c" * 40, "</Parallel>": "y</Thread>"}),
        Limits(max_request_tokens=20),
        "thread 1.1: stopped by the length limit",
    ),
}
