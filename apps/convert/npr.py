"""Native-Parallel-Reasoner's rows in our format (``--from npr``).

Read (for facts only) in bigai-nlco/Native-Parallel-Reasoner: ``npr-beta/prompts/npr.txt``,
``npr-beta/sampling/rejection_sampling.py``, ``npr-beta/train/utils.py``, ``evals/utils/
grader.py``). No wrapper tag: a block is ``<guideline>`` holding ``<plan>k: ...</plan>``s
(numbered like our outlines), then, after ``</guideline>``, one ``<step>\\nk: ...\\n</step>``
per plan, then one ``<takeaway>`` that closes the block; the final answer follows the last
takeaway, outside any tag. The rejection sampler's rows are a JSON array of ``{"id",
"problem", "prompt", "reference", "trajectory": [str, ...], ...}`` (``reference`` is the
ground-truth answer; one trajectory per accepted sample); its SFT set has a rendered chat in
``text``. Mapping: guideline -> Outlines, plan -> Outline, step -> Thread, takeaway ->
sequential text after ``</Parallel>``. Its model is a non-thinking Qwen3, so a trajectory
without ``</think>`` is wrapped: ``<think>\\n{through the last takeaway}\\n</think>\\n{the
rest}``. Each trajectory of a list is a row of its own, with ``sample`` its index.
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
    think_content,
)

NPR = Syntax("npr", "guideline", "guideline", "plan", "step", "takeaway", True, False, text_tags=frozenset({"think"}))

NPR_INSTRUCTION = "\n\nYou must write your answer strictly"
"""Where NPR's format instruction starts in its rendered prompts (cut from the problem)."""


def convert_npr(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """An NPR row with one trajectory (see :func:`samples`) as our chat row, or why not."""
    name = config.text_field or FIELDS["npr"]
    try:
        if config.text_field is None and name not in row and "text" in row:  # a rendered chat, as NPR also ships
            prompt, trajectory = rendered_chat(field_text(row, "text", "no_text"))
            prompt = [{**t, "content": t["content"].split(NPR_INSTRUCTION)[0]} for t in prompt]
        else:
            trajectory = field_text(row, name, "no_text")
            prompt = [{"role": "user", "content": field_text(row, "problem", "no_problem")}]
        converter = Converter(trajectory, NPR, config.max_depth)
        content = converter.convert()
        if "</think>" not in trajectory:  # through the last takeaway in <think>, the final answer after
            content = think_content(content[: converter.cut], content[converter.cut :])
    except Refused as err:
        return err.failure
    return {**row_id(row), "messages": [*prompt, assistant_turn(content)], **answer_field(row, "answer", "reference")}
