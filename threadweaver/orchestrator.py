"""The orchestration state machine: one trajectory, decoded fork-join over any engine.

A sequence is decoded until ``</Outlines>`` (or its end: EOS for the main sequence,
``</Thread>`` for a thread). After ``</Outlines>`` the head is parsed; one request per
outline runs concurrently with context + ``<Thread>`` + ``"i:"``; the threads are
joined in outline order, ``</Parallel>`` is appended and the sequence goes on. Threads
recurse the same way up to ``max_depth``.

Model output never makes it raise. Malformed outlines, too many threads or nesting too
deep decode the rest of that sequence sequentially; a thread that ends with EOS, hits a
token limit or the deadline is closed with an injected ``</Thread>``. An engine error
raises, unless ``degrade_on_engine_error`` is set (RL rollouts, where one failed
request must not lose a batch): then it ends that sequence like a limit would. Tags the model
writes outside a block head are kept as text, and an empty thread stays empty. Each
such event is listed in the trajectory's ``degradations``. Token latency counts the tokens
as the requests generated them (:func:`threadweaver.stats.latency_stats` over the decoded
tree, with the threads the orchestrator closed): a sequence's own generated tokens plus,
per block, its longest thread (all of them, when ``concurrent_threads`` is off and they
run one after another). ``max_tokens`` bounds every token generated: a block's threads
each get an equal share of what is left, so threads running at once cannot overrun it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from threadweaver.cli_args import SettingError, check_counts, check_seconds, option
from threadweaver.engine import Completion, Engine, EngineError, Sampling
from threadweaver.format import Format
from threadweaver.layout import (
    ThreadPath,
    block_join,
    block_tail,
    flat,
    spans,
    thread_close,
    thread_name,
    thread_opening,
)
from threadweaver.stats import LatencyStats, latency_stats
from threadweaver.streaming import OrderedStream, Part
from threadweaver.tree import (
    DEFAULT_MAX_DEPTH,
    Block,
    Node,
    Text,
    Thread,
    TrajectoryFormatError,
    closes_thread,
    parse_head,
)

MOST_THREADS = 16
"""The most threads one block decodes at a time by default; curate proposes no wider block."""


def token_ids(prompt_ids) -> tuple[int, ...]:
    """``prompt_ids`` as a tuple of ints; anything else (text, a tokenizer's ``BatchEncoding``, a tensor of
    rows) is refused here, not sent to an engine that may read it as something else."""
    if isinstance(prompt_ids, (str, bytes, Mapping)) or not isinstance(prompt_ids, Iterable):
        raise TypeError(
            f"prompt_ids must be a list of token ids, not {type(prompt_ids).__name__} (tokenizer.encode(text), or "
            "tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))"
        )
    ids = []
    for token in prompt_ids:
        try:
            ids.append(operator.index(token))
        except TypeError:
            raise TypeError(f"prompt_ids must be a list of token ids (ints), but it holds {token!r}") from None
    if not ids:
        raise ValueError("prompt_ids is empty: an engine needs at least one token to continue")
    if (negative := next((k for k, token in enumerate(ids) if token < 0), None)) is not None:
        raise ValueError(f"prompt_ids holds {ids[negative]} at position {negative}: token ids are 0 or more")
    return tuple(ids)


@dataclass(frozen=True)
class Limits:
    branching: bool = option(True, "Fork-join decoding; off: one plain request, the sequential baseline.")
    concurrent_threads: bool = option(
        True,
        "Run a block's threads at the same time; off runs the same requests one after another "
        "(same tokens under greedy decoding, sequential wall-clock and token latency).",
    )
    max_threads: int = option(MOST_THREADS, "Most threads in one block; more decode sequentially.")
    max_depth: int = option(DEFAULT_MAX_DEPTH, "Deepest nesting of blocks; deeper ones decode sequentially.")
    max_tokens: int = option(
        8192,
        "Most generated tokens in one trajectory, every request counted: a block's threads share what is "
        "left of it equally.",
    )
    max_request_tokens: int | None = option(
        None,
        "Most generated tokens in one request (default: max_tokens); a sequence whose request reaches it ends "
        "there (a thread is closed), even with max_tokens left. A trajectory decoded without branching is one "
        "request.",
    )
    timeout_s: float | None = option(None, "Wall-clock limit per trajectory.")
    warm_join: bool = option(
        False,
        "Once threads 1..j of a block (j >= 2) are done while others still decode, send their text "
        "as a one-token request, so the continuation after the join finds it in the prefix cache.",
    )
    max_requests: int = option(1024, "Most engine requests one trajectory may make; then it ends as at max_tokens.")
    max_concurrent_requests: int = option(
        64, "Most requests of one trajectory in flight at once; more wait their turn."
    )

    def __post_init__(self):
        counts = ("max_threads", "max_depth", "max_tokens", "max_requests", "max_concurrent_requests")
        check_counts(self, counts)
        check_counts(self, ("max_request_tokens",), none_ok=True)
        for name in ("branching", "concurrent_threads", "warm_join"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(name, f"must be true or false, not {getattr(self, name)!r}")
        check_seconds(self, ("timeout_s",), none_ok=True)

    @property
    def request_cap(self) -> int:
        """The most generated tokens one request may ask for: ``max_request_tokens``, else ``max_tokens``."""
        return self.max_tokens if self.max_request_tokens is None else self.max_request_tokens


@dataclass(frozen=True)
class RequestRecord:
    thread_path: ThreadPath
    context_tokens: int
    completion_tokens: int
    finish_reason: str
    started: float
    """Seconds since the trajectory started."""
    ended: float
    cached_tokens: int | None = None
    """Context tokens served from the engine's prefix cache (``None``: the engine does not say)."""
    first_token: float | None = None
    """Seconds since the trajectory started when the first token came: seen in the engine's stream,
    else as the engine reports its queue and prefill time (``None``: neither)."""


DegradationKind = Literal[
    "bad_outlines",
    "too_many_threads",
    "too_deep",
    "closed_by_limit",
    "eos_in_thread",
    "engine_error",
    "stray_tag",
    "empty_thread",
]
DEGRADATION_KINDS: tuple[DegradationKind, ...] = get_args(DegradationKind)


@dataclass(frozen=True)
class Degradation:
    """Something the orchestrator met in the model's output (or the engine) and decoded around."""

    kind: DegradationKind
    path: ThreadPath
    """The sequence it happened in."""
    position: int
    """Trajectory position (0: the first token after the prompt) where it happened."""
    detail: str
    block: int | None = None
    """The block of that sequence it concerns (0-based), for a block that was not forked."""

    def __str__(self) -> str:
        where = thread_name(self.path) + ("" if self.block is None else f", block {self.block + 1}")
        return f"{where}: {self.detail}"

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "text": str(self)}


@dataclass(frozen=True)
class EngineCall:
    """One request's tokens as the engine served them (kept with ``keep_calls``, for RL)."""

    context: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...] | None


FinishReason = Literal["stop", "length", "timeout", "error"]
"""How a trajectory ends: at EOS (``stop``, the one way it ends by itself), or cut short."""
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)


@dataclass(frozen=True)
class Trajectory:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    generated: tuple[bool, ...]
    """Per token: generated by the model, or injected by the orchestrator."""
    nodes: tuple[Node, ...]
    requests: tuple[RequestRecord, ...]
    degradations: tuple[Degradation, ...]
    """What degraded, in the order met; empty for a well-formed run."""
    stats: LatencyStats
    finish_reason: FinishReason
    """``"stop"`` (EOS), ``"length"`` (a token limit), ``"timeout"`` or ``"error"`` (the engine failed)."""
    closed_threads: frozenset[ThreadPath] = frozenset()
    """Thread paths whose ``</Thread>`` the orchestrator injected (a limit or a dropped EOS ended them)."""
    calls: tuple[EngineCall, ...] = ()
    """Every answered request, in the order the engine answered, when the orchestrator keeps them."""
    warmups: int = 0
    """Join warm-up requests sent (``Limits.warm_join``); they are not in ``requests``, ``calls``
    or the token budget, and their one token is dropped."""

    @property
    def well_formed(self) -> bool:
        """Decoded without degrading: the name every report uses for this share."""
        return not self.degradations

    @property
    def degradation_kinds(self) -> frozenset[DegradationKind]:
        return frozenset(d.kind for d in self.degradations)


def trajectory_text(trajectory: Trajectory, fmt: Format) -> str:
    """The generated text, tags included, without its final end-of-sequence token."""
    return generated_text(trajectory.token_ids, fmt)


def generated_text(token_ids: Sequence[int], fmt: Format) -> str:
    """A trajectory's text from its ids (a row's ``token_ids``), without the final end-of-sequence token."""
    ids = list(token_ids)
    if ids and ids[-1] in fmt.eos_ids:
        ids.pop()
    return fmt.decode(ids)


def _kind(value) -> str:
    """A wrong reply, as an error shows it: its type and the start of its repr."""
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


class _Stop(Exception):
    """No request may start: a limit or the deadline was reached."""

    def __init__(self, reason: str, limit: str | None = None):
        self.reason = reason
        self.limit = limit or reason
        """The limit's name, for the record (``max_requests`` ends a sequence as ``"length"``)."""


@dataclass
class _Budget:
    """The tokens a sequence may still generate; a block's threads each get an equal share of it."""

    left: int
    granted: int = 0

    def split(self, ways: int) -> list[_Budget]:
        size, extra = divmod(max(self.left, 0), ways)
        return [_Budget(size + (i < extra), size + (i < extra)) for i in range(ways)]

    def spend(self, shares: list[_Budget]) -> None:
        """What the threads of ``shares`` generated comes off this budget."""
        self.left -= sum(share.granted - share.left for share in shares)


@dataclass
class _Decoded:
    nodes: list[Node]
    ended: str
    """``"stop"`` (EOS or ``</Thread>``), ``"length"`` or ``"timeout"``."""


class Orchestrator:
    def __init__(
        self,
        engine: Engine,
        fmt: Format,
        limits: Limits = Limits(),
        sampling: Sampling = Sampling(),
        degrade_on_engine_error: bool = False,
        keep_calls: bool = False,
    ):
        """``keep_calls``: keep each request's context, completion and log-probs in the trajectory."""
        self.engine, self.fmt, self.limits, self.sampling = engine, fmt, limits, sampling
        self.degrade_on_engine_error = degrade_on_engine_error
        self.keep_calls = keep_calls

    async def run(
        self,
        prompt_ids: Sequence[int],
        sampling: Sampling | None = None,
        on_tokens: Callable[[tuple[int, ...]], None] | None = None,
    ) -> Trajectory:
        """Decode one trajectory; ``sampling`` overrides the orchestrator's for this one.

        ``on_tokens`` receives the trajectory's ids as they become final, in trajectory order
        (see :mod:`threadweaver.streaming`), a thread's once the threads before it are done.
        Concatenated, they are ``token_ids``. With an engine that streams
        (:class:`~threadweaver.engine.StreamingEngine`) they come as the engine generates them;
        otherwise as each request ends. Without ``timeout_s`` and with engine failures raised,
        that is: a request cut short would take back tokens already shown.
        """
        run = _Run(self, token_ids(prompt_ids), sampling or self.sampling, streaming=on_tokens is not None)
        stream = OrderedStream(on_tokens)
        try:
            main = await run.sequence(run.prompt, (), 0, stream.root, _Budget(self.limits.max_tokens))
        finally:
            await run.drop_warmups()
        stream.root.close()
        nodes, closed = tuple(main.nodes), frozenset(run.closed_by_orchestrator)
        ids, generated = flat(nodes, self.fmt.tags, closed)
        stats = latency_stats(
            nodes, self.fmt.tags, closed_threads=closed, concurrent_threads=self.limits.concurrent_threads
        )
        # Each sequence's body starts after its seed (the main one at 0): offsets become positions.
        starts = {span.path: span.start + len(span.ids) for span in spans(nodes, self.fmt.tags) if span.kind == "seed"}
        degradations = []
        for d in run.degradations:  # recorded at offsets into their sequence; ``{position}`` filled in here
            position = starts.get(d.path, 0) + d.position
            detail = d.detail.replace("{position}", str(position))
            degradations.append(dataclasses.replace(d, position=position, detail=detail))
        return Trajectory(
            run.prompt,
            tuple(ids),
            tuple(generated),
            nodes,
            tuple(run.records),
            tuple(degradations),
            stats,
            main.ended,
            closed,
            tuple(run.calls),
            run.warmups_sent,
        )


class _Run:
    """The state of one trajectory: deadline, records, request counts."""

    def __init__(self, orchestrator: Orchestrator, prompt: tuple[int, ...], sampling: Sampling, streaming: bool):
        self.o = orchestrator
        engine = orchestrator.engine
        self.engine = engine.pinned() if hasattr(engine, "pinned") else engine  # one server per trajectory
        self.sampling = sampling
        self.tags = orchestrator.fmt.tags
        self.prompt = prompt
        self.start = time.monotonic()
        limits = orchestrator.limits
        self.deadline = None if limits.timeout_s is None else self.start + limits.timeout_s
        self.records: list[RequestRecord] = []
        self.calls: list[EngineCall] = []
        self.degradations: list[Degradation] = []
        self.closed_by_orchestrator: set[ThreadPath] = set()
        # Live tokens only where a request's tokens are never dropped once seen: no deadline to cut
        # a request short, and an engine failure ends the trajectory (it is not decoded around).
        self.streams_live = streaming and self.deadline is None and not orchestrator.degrade_on_engine_error
        self.warmups: set[asyncio.Task] = set()
        self.warmups_sent = 0
        self.requests_sent = 0
        self.inflight = asyncio.Semaphore(limits.max_concurrent_requests)

    def degrade(self, kind: DegradationKind, path, offset: int, detail: str, block: int | None = None) -> None:
        self.degradations.append(Degradation(kind, path, offset, detail, block))

    async def request(
        self,
        context: tuple[int, ...],
        stop: frozenset[int],
        path,
        at: int,
        budget: _Budget,
        live: Callable | None = None,
    ) -> Completion:
        """One request of sequence ``path``, whose body so far is ``at`` tokens long, within ``budget``.

        ``live``: where a streamed trajectory's engine streams too, it gets the new ids as they come."""
        limits = self.o.limits
        max_tokens = min(limits.request_cap, budget.left)
        if max_tokens <= 0:
            raise _Stop("length")
        if self.requests_sent >= limits.max_requests:
            raise _Stop("length", "max_requests")
        self.requests_sent += 1
        async with self.inflight:
            started = time.monotonic()
            if live is not None and hasattr(self.engine, "stream"):
                call = self.streamed(context, stop, max_tokens, live)
            else:
                call = self.engine.generate(context, sorted(stop), max_tokens, self.sampling)
                if not inspect.isawaitable(call):
                    raise TypeError(f"{self.what()} must be async (async def generate), but returned {_kind(call)}")
            if self.deadline is None:
                try:
                    completion = await call
                except Exception as err:
                    self.engine_failed(err, path, at)
            else:
                try:
                    completion = await asyncio.wait_for(call, max(self.deadline - started, 0.0))
                except asyncio.TimeoutError:
                    raise _Stop("timeout") from None
                except Exception as err:
                    self.engine_failed(err, path, at)
        tokens, finish_reason = self.completed(completion, stop, max_tokens)
        budget.left -= len(tokens)
        waited = completion.first_token_s
        self.records.append(
            RequestRecord(
                path,
                len(context),
                len(tokens),
                finish_reason,
                started - self.start,
                time.monotonic() - self.start,
                completion.cached_tokens,
                None if waited is None else started - self.start + waited,
            )
        )
        logprobs = None if completion.logprobs is None else tuple(completion.logprobs[: len(tokens)])
        if self.o.keep_calls:
            self.calls.append(EngineCall(context, tokens, logprobs))
        return dataclasses.replace(completion, token_ids=tokens, finish_reason=finish_reason, logprobs=logprobs)

    def what(self) -> str:
        """The engine's ``generate``, as an error about its reply names it (the engine given, not a pinned view)."""
        return f"{type(self.o.engine).__name__}.generate"

    def completed(self, completion, stop: frozenset[int], max_tokens: int) -> tuple[tuple[int, ...], str]:
        """A reply's tokens and finish reason as vLLM would give them: cut after its first stop id, and at
        ``max_tokens``. A reply that is not a :class:`Completion` of token ids raises a ``TypeError`` naming
        the engine, where an engine of one's own makes the mistake."""
        if not isinstance(completion, Completion):
            raise TypeError(f"{self.what()} returned {_kind(completion)}, not a threadweaver.engine.Completion")
        ids = completion.token_ids
        try:
            if isinstance(ids, (str, bytes)):
                raise TypeError
            tokens = tuple(map(operator.index, ids[:max_tokens]))  # a NumPy array's ids too, as ints
        except TypeError:
            raise TypeError(f"{self.what()} returned token_ids {_kind(ids)}, not a sequence of ints") from None
        if completion.finish_reason not in ("stop", "length"):
            reason = completion.finish_reason
            raise TypeError(f"{self.what()} returned finish_reason {reason!r}, not 'stop' or 'length'")
        end = next((i + 1 for i, token in enumerate(tokens) if token in stop), None)
        if end is not None:
            return tokens[:end], "stop"
        return tokens, "length" if len(ids) > max_tokens else completion.finish_reason

    async def streamed(self, context, stop: frozenset[int], max_tokens: int, live: Callable) -> Completion:
        """A request through the engine's ``stream``: its runs of ids go to ``live``, its completion is
        returned, with the time its first token came as seen here. Ids past ``max_tokens`` are not passed on
        (an engine of one's own may stream them): its reply is cut there too (:meth:`completed`)."""
        asked, waited, completion, room = time.monotonic(), None, None, max_tokens
        async for item in self.engine.stream(context, sorted(stop), max_tokens, self.sampling):
            if isinstance(item, Completion):
                completion = item
            else:
                if waited is None and item:
                    waited = time.monotonic() - asked
                ids = tuple(item)[:room]
                room -= len(ids)
                live(ids)
        if completion is None:
            raise EngineError("the engine's stream ended without a completion")
        return completion if waited is None else dataclasses.replace(completion, first_token_s=waited)

    def warm(self, context: tuple[int, ...]) -> None:
        """A one-token request over ``context``, not awaited: its prefill fills the prefix cache.
        A failed one only loses its gain."""
        task = asyncio.ensure_future(self.engine.generate(context, [], 1, self.sampling))

        def forget(done: asyncio.Task) -> None:
            self.warmups.discard(done)
            if not done.cancelled():
                done.exception()  # retrieved, so that asyncio does not log a failed one

        task.add_done_callback(forget)
        self.warmups.add(task)
        self.warmups_sent += 1

    async def drop_warmups(self) -> None:
        for task in self.warmups:
            task.cancel()
        await asyncio.gather(*self.warmups, return_exceptions=True)

    def engine_failed(self, err: Exception, path, at: int):
        if not self.o.degrade_on_engine_error:
            raise err
        detail = f"the engine failed ({type(err).__name__}: {err}); the sequence stopped there"
        self.degrade("engine_error", path, at, detail)
        raise _Stop("error") from None

    def check_stray(self, text: list[int], path, at: int) -> None:
        """Record structural tags the model wrote in plain text (kept as text), which starts at offset ``at``."""
        stray = sorted({t for t in text if t in self.tags.structural}, key=text.index)
        if stray:
            names = ", ".join(self.o.fmt.tag_name(t) for t in stray)
            self.degrade("stray_tag", path, at + text.index(stray[0]), f"stray {names} outside a block; kept as text")

    async def sequence(self, context: tuple[int, ...], path, depth: int, part: Part, budget: _Budget) -> _Decoded:
        """Decode one sequence from ``context``: the main one (to EOS) or a thread (to ``</Thread>``),
        writing its final tokens to ``part``, generating at most ``budget`` tokens (its blocks' included)."""
        tags, limits, fmt = self.tags, self.o.limits, self.o.fmt
        in_thread = bool(path)
        branching = limits.branching
        nodes: list[Node] = []
        text: list[int] = []  # the current run of sequential tokens
        out: list[int] = []  # everything after ``context`` so far
        text_start = 0  # where ``text`` starts in ``out``
        emitted = 0  # how much of ``text`` is in ``part`` (all of it is final, but a trailing stop token)
        blocks = 0
        ended, limit = "stop", None
        last = None
        while True:
            part.add(text[emitted:])  # going on: what the sequence has is final
            emitted = len(text)
            stop = set(fmt.eos_ids)
            if branching:
                stop.add(tags.outlines_end)
            if in_thread:
                stop.add(tags.thread_end)
            live = _Live(part, stop) if self.streams_live else None
            try:
                completion = await self.request(context + tuple(out), frozenset(stop), path, len(out), budget, live)
            except _Stop as halt:
                ended, limit = halt.reason, halt.limit
                break
            tokens = list(completion.token_ids)
            out.extend(tokens)
            text.extend(tokens)
            emitted += min(live.count, len(tokens)) if live else 0
            last = tokens[-1] if tokens else None
            if branching and last == tags.outlines_end:
                part.add(text[emitted:])  # the head, and the text before it: final whether or not it forks
                emitted = len(text)
                block = await self.fork(context + tuple(out), text, text_start, path, depth, blocks, part, budget)
                if block is None:
                    branching = False  # the rest of this sequence decodes as plain text
                    continue
                node, head_start = block
                if head_start:
                    self.check_stray(text[:head_start], path, text_start)
                    nodes.append(Text(tuple(text[:head_start])))
                text, emitted = [], 0
                nodes.append(node)
                out.extend(block_tail(node, tags))
                text_start = len(out)
                blocks += 1
                continue
            if in_thread and last == tags.thread_end:
                if not closes_thread(text[:-1], tags):
                    continue  # closes a thread the model wrote itself in degraded text
                text.pop()
                break
            if last in fmt.eos_ids:
                if in_thread:
                    text.pop()
                    detail = "end-of-sequence token inside the thread; dropped and the thread closed"
                    self.degrade("eos_in_thread", path, len(out) - 1, detail)
                break
            if completion.finish_reason == "length" or not tokens:
                ended = "length"
                break
        if text:
            if branching:
                self.check_stray(text, path, text_start)
            nodes.append(Text(tuple(text)))
            part.add(text[emitted:])
        if in_thread and not nodes and ended == "stop":
            self.degrade("empty_thread", path, 0, "the thread is empty")
        if in_thread and (ended != "stop" or last != tags.thread_end):
            self.closed_by_orchestrator.add(path)
            if ended == "error":
                self.degrade("engine_error", path, len(out), "closed after the engine error")
            elif ended != "stop":
                detail = f"stopped by the {limit or ended} limit; the thread was closed"
                self.degrade("closed_by_limit", path, len(out), detail)
        return _Decoded(nodes, ended)

    async def fork(
        self, context, text: list[int], at: int, path, depth: int, block_index: int, part: Part, budget: _Budget
    ):
        """Run the block whose head ends ``text`` (at offset ``at``); None, degraded, if it must stay sequential.

        Its threads share what is left of ``budget`` equally, whether they run at once or one after
        another: the same tokens either way, and never more than the budget in all."""
        tags, limits = self.tags, self.o.limits
        starts = [i for i, t in enumerate(text) if t == tags.parallel]
        if not starts:
            detail = "</Outlines> without <Parallel>; decoded sequentially"
            self.degrade("bad_outlines", path, at + len(text) - 1, detail, block_index)
            return None
        head_start = starts[-1]
        head = tuple(text[head_start:])
        at += head_start
        try:
            outlines = parse_head(head, self.o.fmt)
        except TrajectoryFormatError as err:
            fault = err.fault
            where = "token {position}" + (f" ({fault.tag})" if fault.tag else "")
            detail = f"malformed outlines ({where}: {fault.message}); decoded sequentially"
            self.degrade("bad_outlines", path, at + fault.position, detail, block_index)
            return None
        if len(outlines) > limits.max_threads:
            detail = f"{len(outlines)} outlines exceed max_threads={limits.max_threads}; decoded sequentially"
            self.degrade("too_many_threads", path, at, detail, block_index)
            return None
        if depth + 1 > limits.max_depth:
            detail = f"nested {depth + 1} deep, over max_depth={limits.max_depth}; decoded sequentially"
            self.degrade("too_deep", path, at, detail, block_index)
            return None

        threads = [(o, part.child()) for o in outlines]
        shares = budget.split(len(outlines))
        finished: list[Thread | None] = [None] * len(outlines)
        warmed = 1  # thread 1's text is in the cache already: its own request computed it

        def warm_join() -> None:
            """Threads 1..j are done, later ones are not: prefill the continuation's context so far."""
            nonlocal warmed
            j = next((i for i, t in enumerate(finished) if t is None), len(finished))
            if warmed < j < len(finished):
                warmed = j
                block = Block(head, outlines[:j], tuple(finished[:j]))
                self.warm(context + tuple(block_tail(block, tags, joined=False)))

        async def thread(i: int, outline, thread_part: Part) -> _Decoded:
            seed = self.o.fmt.seed(outline.number)
            opening = thread_opening(tags, seed)
            thread_part.add(opening)
            path_ = (*path, (block_index, outline.number))
            decoded = await self.sequence(context + opening, path_, depth + 1, thread_part, shares[i])
            thread_part.add(thread_close(tags))
            thread_part.close()
            if limits.warm_join and limits.concurrent_threads:
                finished[i] = Thread(outline.number, seed, tuple(decoded.nodes))
                warm_join()
            return decoded

        if limits.concurrent_threads:
            decoded = await asyncio.gather(*(thread(i, o, p) for i, (o, p) in enumerate(threads)))
        else:
            decoded = [await thread(i, o, p) for i, (o, p) in enumerate(threads)]
        budget.spend(shares)
        part.add(block_join(tags))
        threads = tuple(Thread(o.number, self.o.fmt.seed(o.number), tuple(d.nodes)) for o, d in zip(outlines, decoded))
        return Block(head, outlines, threads), head_start


class _Live:
    """A request's tokens as the engine streams them, into its sequence's part, up to the first
    stop token: that one (``</Thread>``, ``</Outlines>``, EOS) waits until the sequence knows
    what it means (EOS inside a thread is dropped)."""

    def __init__(self, part: Part, stop: set[int]):
        self.part, self.stop = part, stop
        self.count = 0
        self.held = False

    def __call__(self, ids: tuple[int, ...]) -> None:
        if self.held:
            return
        cut = next((i for i, t in enumerate(ids) if t in self.stop), None)
        if cut is not None:
            ids, self.held = ids[:cut], True
        self.part.add(ids)
        self.count += len(ids)
