"""The reference's SFT parquet in our format (``--from reference``).

Read (for facts only) in facebookresearch/threadweaver, ``data_generation/src/save_dataset.py``,
``filter-format-correct-and-obtain-stats.py``). A parquet whose ``qwen_text`` column is the
whole chat rendered by the Qwen3 template: ``<|im_start|>user\\n{problem} {instruction}
<|im_end|>\\n<|im_start|>assistant\\n<think>\\n...\\n</think>\\n\\n{answer}<|im_end|>\\n``; the
problem is also a ``question`` column, but the prompt we keep is the rendered turns before the
assistant's (instruction included), as the reference trained on it. Threads are normalised to
``<Thread>\\nk: ...\\n</Thread>`` with nothing between adjacent threads; outlines are
``<Outline>k: ...</Outline>`` inside ``<Outlines>``, with whitespace between them; a block
may end with one ``<Conclusion>`` after its threads, inside ``</Parallel>``. Mapping: the
thread and outline text loses the whitespace around ``k:`` and at its end, so
``<Thread>\\nk: text\\n</Thread>`` becomes ``<Thread>k:text</Thread>``; whitespace between
tags of a block is dropped; the Conclusion becomes sequential text after ``</Parallel>``.
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
    rendered_chat,
    row_id,
)

REFERENCE = Syntax(
    "reference", "Parallel", "Outlines", "Outline", "Thread", "Conclusion", False, False, text_tags=frozenset({"think"})
)


def convert_reference(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """A row of the reference's SFT parquet (its rendered ``qwen_text``) as our chat row, or why not."""
    try:
        prompt, content = rendered_chat(field_text(row, config.text_field or FIELDS["reference"], "no_text"))
        content = Converter(content, REFERENCE, config.max_depth).convert()
    except Refused as err:
        return err.failure
    return {**row_id(row), "messages": [*prompt, assistant_turn(content)], **answer_field(row, "answer")}
