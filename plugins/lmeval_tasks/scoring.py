"""Per-document metrics of the tw_* tasks (avg@k over a document's repeats).

* ``acc``: the last ``\\boxed{}`` answer equals the gold one (math-verify).
* ``token_latency``: generated tokens on the critical path; ``total_tokens``: all
  generated tokens; ``speedup``: their ratio, per response.
* ``parallel_activation``: responses with at least one parallel block.
* ``well_formed``: responses the orchestrator decoded without degrading.
* ``cut_short``: responses that did not end by themselves (``finish_reason`` not
  ``stop``: a token limit, or ``timeout_s``); NaN for responses the orchestrator did not decode.
* ``stats_measured``: 1 where the token counts are the orchestrator's own, 0 where the
  response was tokenised here (another backend, or lm-eval's response cache).
* ``degraded_<kind>``: responses in which the orchestrator met a degradation of that kind
  (:data:`threadweaver.orchestrator.DEGRADATION_KINDS`); NaN for responses it did not decode.
"""

from __future__ import annotations

import math
import warnings

from threadweaver.metrics import trajectory_metrics
from threadweaver.orchestrator import DEGRADATION_KINDS
from threadweaver.reward import is_correct

from . import measured
from .data import GOLD_COLUMN

HIGHER_IS_BETTER = {
    "acc": True,
    "token_latency": False,
    "total_tokens": False,
    "speedup": True,
    "parallel_activation": True,
    "well_formed": True,
    "cut_short": False,
    "stats_measured": True,
    **{f"degraded_{kind}": False for kind in DEGRADATION_KINDS},
}

_warned = False


def response_metrics(response: str, gold: str) -> dict[str, float]:
    found = measured.lookup(response)
    is_measured = found is not None
    if found is None:
        tokenizer = measured.fallback_tokenizer()
        if tokenizer is not None:
            found = measured.count_tokens(response, tokenizer)
    metrics = {"acc": float(is_correct(response, gold)), "stats_measured": float(is_measured)}
    if found is None:
        _warn_no_tokenizer()
        return {**metrics, **{m: math.nan for m in HIGHER_IS_BETTER if m not in metrics}}
    stats, well_formed, kinds, finish_reason = found
    shared = trajectory_metrics(stats.total_tokens, stats.critical_path_tokens, stats.blocks, well_formed, kinds)
    return {
        **metrics,
        "token_latency": shared.pop("critical_path_tokens"),  # the paper's name, in lm-eval's tables
        **shared,
        "cut_short": math.nan if finish_reason is None else float(finish_reason != "stop"),
    }


def process_results(doc: dict, results: list) -> dict[str, float]:
    """Mean of each metric over the document's responses (one per repeat)."""
    responses = results[0] if len(results) == 1 and isinstance(results[0], list) else results
    per_response = [response_metrics(r, doc[GOLD_COLUMN]) for r in responses]
    return {m: sum(p[m] for p in per_response) / len(per_response) for m in HIGHER_IS_BETTER}


def keep_all(resps, docs):
    """lm-eval filter that keeps every repeat (its default keeps only the first)."""
    return resps


def _warn_no_tokenizer() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"token statistics need a tokenizer for responses another backend produced: pass tokenizer=... "
            f"in --model_args or set {measured.TOKENIZER_ENV}; they are NaN here",
            RuntimeWarning,
            stacklevel=3,
        )
