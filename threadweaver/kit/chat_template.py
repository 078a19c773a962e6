"""A ChatML chat template for thinking models (the Qwen3 layout, without tools).

The generation prompt is ``<|im_start|>assistant\\n``; the assistant writes ``<think>``
itself, so the trajectory (the part ThreadWeaver parses) starts at ``<think>``. As in
Qwen3, ``enable_thinking=False`` pre-fills an empty think block instead.
"""

CHATML_THINK = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
