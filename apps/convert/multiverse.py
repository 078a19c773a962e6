"""Multiverse-1K rows in our format (``--from multiverse``).

Read (for facts only) in Multiverse-1K; Multiverse4FM/Multiverse, read in its fork ogso-eu/Multiverse:
``data/src/data/parse.py``, ``distance.py``, ``tokenization_multiverse.py``, ``data/prompt/
step3-prompt.txt``). A row is an s1K-1.1 row plus ``deepseek_thinking_trajectory_parallel``:
``<Think>...</Think>``, in which ``<Parallel>`` holds one ``<Goal>`` of ``<Outline>``s, then
``<Path>``s, then one ``<Conclusion>``, the last child, inside ``</Parallel>``. Every tag
stands on a line of its own. Outlines and paths start ``n: ``, and a nested block (inside a
``<Path>``) numbers them with the parent's id: ``1.1: ``, ``1.2: ``. The problem is
``question`` and the final answer text ``deepseek_attempt``. Mapping: Goal -> Outlines,
Path -> Thread, the dotted number -> its last part (the bare local number is accepted too),
the Conclusion -> sequential text right after ``</Parallel>``; the assistant content is
``<think>\\n{converted}\\n</think>\\n{deepseek_attempt}``.
"""

from __future__ import annotations

from .grammar import (
    FIELDS,
    ConvertConfig,
    Converter,
    Failure,
    Refused,
    Syntax,
    answer_field,
    assistant_turn,
    field_text,
    row_id,
    think_content,
)

MULTIVERSE = Syntax(
    "multiverse", "Parallel", "Goal", "Outline", "Path", "Conclusion", True, True, extra=frozenset({"Think"})
)


def convert_multiverse(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """A Multiverse-1K row as our chat row, or why not."""
    try:
        text = field_text(row, config.text_field or FIELDS["multiverse"], "no_text").strip()
        problem = field_text(row, "question", "no_problem")
        if text.startswith("<Think>") and text.endswith("</Think>"):
            text = text[len("<Think>") : -len("</Think>")]
        reasoning = Converter(text, MULTIVERSE, config.max_depth).convert()
        final = field_text(row, "deepseek_attempt", "no_final")  # the answer after </think>
    except Refused as err:
        return err.failure
    content = think_content(reasoning, final)
    return {
        **row_id(row),
        "messages": [{"role": "user", "content": problem}, assistant_turn(content)],
        **answer_field(row, "answer"),
    }
