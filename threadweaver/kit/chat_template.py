"""A ChatML chat template for thinking models (the Qwen3 layout, without tools).

The generation prompt is ``<|im_start|>assistant\\n``; the assistant writes ``<think>``
itself, so the trajectory (the part ThreadWeaver parses) starts at ``<think>``.
"""

CHATML_THINK = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
