"""The side channel from the ``threadweaver`` model to the tasks' token metrics.

lm-eval hands a task's ``process_results`` only the response strings. So the model
returns each response as a :class:`Response`: its text, carrying the counts the
orchestrator measured for it, which the tasks' ``keep_all`` filter passes on unchanged.
A plain string (another backend such as ``local-completions``, or lm-eval's response
cache) is tokenised instead; the ``stats_measured`` metric (1 measured, 0 tokenised)
says which. Token counts include the end-of-sequence token that ends a response, as the
orchestrator counts it, though the text leaves it out.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any, NamedTuple

from threadweaver.stats import LatencyStats, latency_stats

TOKENIZER_ENV = "THREADWEAVER_TOKENIZER"


class Measured(NamedTuple):
    """A response's latency statistics, whether it was well-formed, the kinds of degradation the
    orchestrator met and its ``finish_reason`` (the last two None when it was tokenised here)."""

    stats: LatencyStats
    well_formed: bool
    kinds: frozenset[str] | None
    finish_reason: str | None


class Response(str):
    """A response's text with its measured counts: they travel with it to its own document.

    It pickles as the plain text, so lm-eval's ``--use_cache`` stores only that.
    """

    measured: Measured

    def __new__(cls, text: str, measured: Measured):
        response = super().__new__(cls, text)
        response.measured = measured
        return response

    def __reduce__(self):
        return str, (str(self),)


def lookup(response: str) -> Measured | None:
    """The counts the model measured for ``response``, or None for a plain string."""
    return getattr(response, "measured", None)


_lock = threading.Lock()
_tokenizer: Any = None
_tokenizer_hint: str | None = None
_unloadable: set[str] = set()
"""Tokenizer names that failed to load: tried once, and their responses' counts are NaN."""


def use_tokenizer(tokenizer: Any) -> None:
    """The tokenizer a response that was not measured here is counted with (set by the model)."""
    global _tokenizer
    with _lock:
        _tokenizer = tokenizer


def hint_tokenizer(name: str | None) -> None:
    """A tokenizer name from lm-eval's metadata (``--model_args``/``--metadata``), if none is set."""
    global _tokenizer_hint
    with _lock:
        if name and _tokenizer_hint is None:
            _tokenizer_hint = name


def fallback_tokenizer() -> Any:
    """The tokenizer for responses the model did not measure, or None if nothing names one."""
    global _tokenizer
    with _lock:
        if _tokenizer is not None:
            return _tokenizer
        name = os.environ.get(TOKENIZER_ENV) or _tokenizer_hint
    if not name:
        return None
    from transformers import AutoTokenizer

    if name in _unloadable:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:  # after every response was generated: their scores are kept
        _unloadable.add(name)
        warnings.warn(
            f"cannot load the tokenizer {name!r} to count the responses' tokens: {err}", RuntimeWarning, stacklevel=3
        )
        return None
    with _lock:
        _tokenizer = tokenizer
    return tokenizer


def count_tokens(text: str, tokenizer: Any) -> Measured:
    """A response's statistics by tokenising it: the post-hoc parser's view of the text.

    Malformed parts count as sequential text, as the orchestrator would have decoded
    them; a tokenizer without the tags sees one sequential chain. The response is taken
    to have ended with the tokenizer's end-of-sequence token, which the text leaves out
    but the orchestrator counts.
    """
    from threadweaver.format import Format
    from threadweaver.tree import Text, parse_text

    eos = () if tokenizer.eos_token_id is None else (Text((tokenizer.eos_token_id,)),)
    try:
        fmt = Format.from_tokenizer(tokenizer)
    except ValueError:
        chain = [Text(tuple(tokenizer.encode(text, add_special_tokens=False))), *eos]
        return Measured(latency_stats(chain), True, None, None)
    parsed = parse_text(text, fmt, strict=False)
    return Measured(latency_stats([*parsed.nodes, *eos], fmt.tags), parsed.well_formed, None, None)
