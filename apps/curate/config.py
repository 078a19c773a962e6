"""The settings of ``threadweaver curate``, each declared once; their help is the command's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from threadweaver.cli_args import SettingError, check_counts, check_seconds, option
from threadweaver.orchestrator import MOST_THREADS

MOST_UNITS = 4096
"""The most reasoning lines a trace may have (``--max-units``): the bound of a unit number in the
segment reply, both in the schema sent and in the reply's local validation."""


@dataclass(frozen=True)
class CurateArgs:
    traces: str = field(
        metadata={"help": "Sequential traces: JSONL, parquet or a JSON array (chat, flat or `generate` rows)."}
    )
    out: str = field(metadata={"help": "Folder for train.jsonl, dropped.jsonl, report.json and the call cache."})
    tokenizer: str = option(
        "qwen", "The target model's tokenizer: 'qwen', 'synth', a directory or hub id (checks the round trip)."
    )
    dry_run: bool = option(False, "Read and check the traces and estimate the tokens and cost; call nothing.")


@dataclass(frozen=True)
class LLMArgs:
    base_url: str | None = option(
        None, "OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL, else OpenAI)."
    )
    model: str | None = option(None, "Model name the endpoint serves (needed for every run but a dry one).")
    api_key: str | None = option(None, "API key (default: $OPENAI_API_KEY; a local server needs none).")
    concurrency: int = option(16, "LLM requests in flight at once.")
    temperature: float = option(0.0, "Sampling temperature of every call.")
    max_reply_tokens: int = option(1024, "Token budget of a reply; a reply cut at it is asked again with twice this.")
    timeout_s: float = option(300.0, "Seconds before one request times out (then it is retried).")
    retries: int = option(4, "Retries of a request after a connection error, timeout, 429 or 5xx.")
    reasks: int = option(1, "Times a refused reply (invalid JSON, schema, a check) is asked again with the reason.")
    extra_body: str | None = option(
        None,
        "JSON object added to every request, for the server's own fields, e.g. "
        '\'{"chat_template_kwargs": {"enable_thinking": false}}\' for a Qwen3 model on vLLM.',
    )

    def __post_init__(self):
        check_counts(self, ("concurrency", "max_reply_tokens"))
        check_counts(self, ("retries", "reasks"), least=0)
        if not 0 <= self.temperature <= 2:
            raise SettingError("temperature", f"must be 0 to 2, as OpenAI's API takes it, not {self.temperature}")
        check_seconds(self, ("timeout_s",))
        if self.extra_body is not None:
            try:
                body = json.loads(self.extra_body)
            except json.JSONDecodeError as err:
                raise SettingError("extra_body", f"is not JSON ({err})") from None
            if not isinstance(body, dict):
                raise SettingError("extra_body", "must be a JSON object")


@dataclass(frozen=True)
class CurateConfig:
    max_threads: int = option(4, "Most threads in one block.")
    min_parallel_chars: int = option(40, "Least characters of a block outside its longest thread.")
    max_units: int = option(
        400, f"Traces with more reasoning lines than this are dropped (too_many_units); at most {MOST_UNITS}."
    )
    max_edit_chars: int = option(120, "Longest find or replace string of a decoupling edit.")
    max_change: float = option(0.3, "Largest share of a thread the decoupling edits may change.")
    min_speedup: float = option(1.05, "Least token-latency speedup of a kept trajectory.")
    max_tokens: int | None = option(
        None, "Drop trajectories that generated more than this many tokens, all threads' together (default: no limit)."
    )
    price_prompt: float = option(0.0, "USD per million prompt tokens, for the report and --max-cost.")
    price_completion: float = option(0.0, "USD per million completion tokens.")
    price_cached: float | None = option(None, "USD per million cached prompt tokens (default: the prompt price).")
    max_cost: float | None = option(None, "Stop starting new traces once this many USD are spent (default: no limit).")
    limit: int | None = option(None, "Curate only the first N traces.")

    def __post_init__(self):
        if not 2 <= self.max_threads <= MOST_THREADS:
            raise SettingError("max_threads", f"must be 2..{MOST_THREADS}, not {self.max_threads}")
        if not 2 <= self.max_units <= MOST_UNITS:
            raise SettingError(
                "max_units",
                f"must be 2..{MOST_UNITS} (the most unit numbers a segment reply may give), not {self.max_units}",
            )
        if not 0 <= self.max_change <= 1:
            raise SettingError("max_change", f"is a share (0..1), not {self.max_change}")
        check_counts(self, ("limit", "max_tokens"), none_ok=True)
        for name in ("price_prompt", "price_completion", "price_cached", "max_cost"):
            if (value := getattr(self, name)) is not None and value < 0:
                raise SettingError(name, f"must be 0 or more USD, not {value}")
        if self.max_cost is not None and not (self.price_prompt or self.price_completion or self.price_cached):
            raise SettingError("max_cost", "needs the prices it counts: give --price-prompt and --price-completion")

    def cost(self, usage: dict) -> float:
        cached = usage["cached_tokens"]
        cached_price = self.price_prompt if self.price_cached is None else self.price_cached
        dollars = (
            (usage["prompt_tokens"] - cached) * self.price_prompt
            + cached * cached_price
            + usage["completion_tokens"] * self.price_completion
        )
        return dollars / 1e6
