"""Hypothesis strategies for random nested fork-join trees over the character codec."""

from chars import char_format
from hypothesis import strategies as st

from threadweaver.tree import Block, Outline, Text, Thread

FMT = char_format()
T = FMT.tags
words = st.text(alphabet="abcxyz =+\n", min_size=1, max_size=6).map(lambda s: tuple(map(ord, s)))
gaps = st.one_of(st.just(()), st.just((ord("\n"),)))


def _merge(nodes):
    out = []
    for node in nodes:
        if out and isinstance(node, Text) and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].ids + node.ids)
        else:
            out.append(node)
    return tuple(out)


@st.composite
def blocks(draw, depth, max_depth):
    k = draw(st.integers(1, 3))
    head = [T.parallel, *draw(gaps), T.outlines]
    outlines = []
    for i in range(1, k + 1):
        body = FMT.seed(i) + draw(words)
        outlines.append(Outline(i, body))
        head += [*draw(gaps), T.outline, *body, T.outline_end]
    head += [*draw(gaps), T.outlines_end]
    threads = []
    for i in range(1, k + 1):
        body = draw(sequences(depth + 1, max_depth, min_size=1))
        threads.append(Thread(i, FMT.seed(i), body))
    return Block(tuple(head), tuple(outlines), tuple(threads))


@st.composite
def sequences(draw, depth=0, max_depth=3, min_size=0):
    items = []
    for _ in range(draw(st.integers(min_size, 3))):
        if depth < max_depth and draw(st.integers(0, 2)) == 0:
            items.append(draw(blocks(depth, max_depth)))
        else:
            items.append(Text(draw(words)))
    return _merge(items)


prompts = st.lists(st.integers(1, 200), min_size=1, max_size=5).map(tuple)


def all_blocks(nodes):
    """Every block of a tree, nested ones included, in pre-order."""
    for node in nodes:
        if isinstance(node, Block):
            yield node
            for thread in node.threads:
                yield from all_blocks(thread.body)
