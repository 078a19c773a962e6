"""The side channel from the ``threadweaver`` model to the tasks' token metrics.

lm-eval hands a task's ``process_results`` only the response strings. So the model
records, per response it returns, the counts the orchestrator measured, and the tasks
look them up by the response text. A response this process's model did not produce
(another backend such as ``local-completions``, or lm-eval's response cache) is
tokenised instead; the ``stats_measured`` metric (1 measured, 0 tokenised) says which.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from threadweaver.stats import LatencyStats, latency_stats

TOKENIZER_ENV = "THREADWEAVER_TOKENIZER"


Measured = tuple[LatencyStats, bool, frozenset[str] | None]
"""A response's latency statistics, whether it was well-formed, and the kinds of degradation the
orchestrator met (None when the response was tokenised here, not measured)."""


_lock = threading.Lock()
_by_text: dict[bytes, Measured] = {}
"""Keyed by a digest of the text: lm-eval already holds every response once."""
_tokenizer: Any = None
_tokenizer_hint: str | None = None


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def record(text: str, stats: LatencyStats, kinds: frozenset[str]) -> None:
    with _lock:
        _by_text[_key(text)] = (stats, not kinds, kinds)


def lookup(text: str) -> Measured | None:
    with _lock:
        return _by_text.get(_key(text))


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

    tokenizer = AutoTokenizer.from_pretrained(name)
    with _lock:
        _tokenizer = tokenizer
    return tokenizer


def count_tokens(text: str, tokenizer: Any) -> Measured:
    """A response's statistics by tokenising it: the post-hoc parser's view of the text.

    Malformed parts count as sequential text, as the orchestrator would have decoded
    them; a tokenizer without the tags sees one sequential chain.
    """
    from threadweaver.format import Format
    from threadweaver.tree import Text, parse_text

    try:
        fmt = Format.from_tokenizer(tokenizer)
    except ValueError:
        return latency_stats([Text(tuple(tokenizer.encode(text, add_special_tokens=False)))]), True, None
    parsed = parse_text(text, fmt, strict=False)
    return latency_stats(parsed.nodes, fmt.tags), parsed.well_formed, None
