"""``PGRPOTrainer``: TRL's ``GRPOTrainer`` with fork-join rollouts, each trained as one token trie.

Rollouts: the shared orchestrator decodes each prompt's ``num_generations`` trajectories,
by default with the policy itself in-process (a batched transformers ``generate`` per
block). With ``use_vllm=True, vllm_mode="colocate"`` they run on TRL's own colocated
vLLM, which TRL keeps in sync with the policy, and each trained token carries the
log-prob vLLM sampled it with, for TRL's importance-sampling correction. Any
:class:`~threadweaver.orchestrator.Engine` may be passed as ``engine=`` instead, e.g. a
vLLM or SGLang server whose weights the caller keeps in sync.

What it takes from GRPOTrainer beyond its public API is listed in
:mod:`threadweaver.trl_pgrpo.trl_internals`.

Training: each trajectory is ONE row, its trie split after the prompt
(:func:`threadweaver.pgrpo.trie_row`). TRL sees the trie after the prompt as the
"completion" and ``env_mask`` marks the tokens the model sampled in that very context.
This trainer scores every completion token from its trie parent's logits under the tree
mask, with trie depths as positions, so TRL's own advantages (one scalar per trajectory,
broadcast to its tokens), clipping and loss apply unchanged. A step whose gradient is exactly
zero (every group at one reward, ``beta=0``) takes no optimizer step
(:mod:`threadweaver.trl_pgrpo.idle_steps`).
"""

from __future__ import annotations

import dataclasses
import warnings
from statistics import fmean

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from threadweaver.batch import decode_many, run_sync
from threadweaver.hf_collator import use_tree_attention
from threadweaver.metrics import rollout_metrics
from threadweaver.orchestrator import Engine, Orchestrator, Sampling, Trajectory, trajectory_text
from threadweaver.pgrpo import TrieRow, sampling_logprobs, trie_row
from threadweaver.reward import answer_text, is_correct
from threadweaver.rows import RowReader, prompt_messages
from threadweaver.trl_pgrpo.config import PGRPOConfig
from threadweaver.trl_pgrpo.idle_steps import SkipIdleSteps
from threadweaver.trl_pgrpo.rewards import GOLD_COLUMN, pgrpo_rewards, reads_gold
from threadweaver.trl_pgrpo.scoring import parent_logps
from threadweaver.trl_pgrpo.trl_internals import replace_step_metric, with_completions
from threadweaver.trl_pgrpo.vllm_sync import use_vllm_reload

TREE_KEYS = ("tree_parent", "tree_position", "tree_end")
"""Per completion token of a row: its parent's row index, its trie depth, the end of its subtree."""


class PGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        model,
        reward_funcs=None,
        args: PGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        engine: Engine | None = None,
        **kwargs,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = PGRPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-PGRPO")
        elif not isinstance(args, PGRPOConfig):
            raise TypeError(
                f"PGRPOTrainer needs a PGRPOConfig (P-GRPO's defaults and rollout settings), not a "
                f"{type(args).__name__}"
            )
        if args.use_vllm and engine is not None:
            raise ValueError("use_vllm=True rolls out on TRL's colocated vLLM; pass either it or engine=, not both")
        if kwargs.get("rollout_func") is not None:
            raise TypeError("PGRPOTrainer decodes its own fork-join rollouts; pass engine= to choose where")
        if reward_funcs is None:
            reward_funcs = pgrpo_rewards(args.reward_config())
        gold = any(map(reads_gold, reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]))
        with args.main_process_first(desc="P-GRPO prompts"):  # as TRL prepares its datasets: one cache for all ranks
            train_dataset = problem_dataset(train_dataset, "train_dataset", gold)
            eval_dataset = problem_dataset(eval_dataset, "eval_dataset", gold)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            rollout_func=self._rollout,
            **kwargs,
        )
        self.reader = RowReader(self._tokenizer, **self.chat_template_kwargs)
        self.fmt = self.reader.fmt
        self.add_callback(SkipIdleSteps(self._metrics["train"]))
        _warn_half_precision(self.model, args.learning_rate)
        use_tree_attention(self.model)
        if self.ref_model is not None:
            use_tree_attention(self.ref_model)
        if args.use_vllm:
            use_vllm_reload(self.vllm_generation)
        self.engine = engine
        self._tree: dict[str, torch.Tensor] | None = None
        self._trajectories: list[Trajectory] = []
        self._gathered: list[Trajectory] = []
        """This step's rollouts from every process, their token lists dropped: for the logs."""

    # Rollouts ---------------------------------------------------------------------------

    def _decode(self, prompt_ids: list[list[int]]) -> list[Trajectory]:
        args = self.args
        model = self.accelerator.unwrap_model(self.model)
        training = model.training
        engine = self.engine
        if engine is None and self.use_vllm:
            from threadweaver.vllm_orchestrator.llm_engine import LLMEngine

            engine = LLMEngine(self.vllm_generation.llm, logprobs=self._needs_sampling_logprobs)
        elif engine is None:
            from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

            engine = TransformersEngine(model, pad_token_id=self._tokenizer.pad_token_id, max_batch=len(prompt_ids))
        sampling = Sampling(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k if args.top_k and args.top_k > 0 else -1
        )
        orchestrator = Orchestrator(engine, self.fmt, args.limits(), sampling, keep_calls=self._needs_sampling_logprobs)

        async def decode_all() -> list[Trajectory]:
            out: list[Trajectory | None] = [None] * len(prompt_ids)
            async for i, trajectory, _ in decode_many(orchestrator, prompt_ids, concurrency=len(prompt_ids)):
                out[i] = trajectory
            return out

        model.eval()
        try:
            return run_sync(decode_all())
        finally:
            model.train(training)

    @property
    def _needs_sampling_logprobs(self) -> bool:
        """TRL's importance-sampling correction compares each token's training log-prob with vLLM's."""
        return self.use_vllm and self.vllm_importance_sampling_correction

    def _rollout(self, prompts: list, trainer=None) -> dict:
        """TRL's ``rollout_func``: one fork-join trajectory per prompt row, as trie rows."""
        trajectories = self._decode([self.reader.prompt({"prompt": p}) for p in prompts])
        rows = [trie_row(t, self.fmt) for t in trajectories]
        self._trajectories = trajectories
        self._tree = _tree_tensors(rows, self.accelerator.device)
        logprobs = None
        if self._needs_sampling_logprobs:
            logprobs = [sampling_logprobs(row, t.calls) for row, t in zip(rows, trajectories)]
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": logprobs,
            "env_mask": [r.trained for r in rows],
            "trajectory_stats": [t.stats.as_dict() for t in trajectories],
        }

    def _generate(self, prompts: list):
        """TRL's generation step, with each rollout's own text as its completion (not the trie's tokens)."""
        result = super()._generate(prompts)
        texts = [trajectory_text(t, self.fmt) for t in self._trajectories]
        conversational = is_conversational({"prompt": prompts[0]})
        result = with_completions(
            result, [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        )
        # TRL reads truncation off a row's last token, which in a trie ends a branch: redo it per trajectory.
        self._gathered = gather_object([_without_tokens(t) for t in self._trajectories])
        ended = [t.stats.total_tokens for t in self._gathered if t.finish_reason == "stop"] or [0]
        metrics = self._metrics["train" if self.model.training else "eval"]
        for name, value in {
            "completions/clipped_ratio": fmean(t.finish_reason != "stop" for t in self._gathered),
            "completions/mean_terminated_length": fmean(ended),
            "completions/min_terminated_length": min(ended),
            "completions/max_terminated_length": max(ended),
        }.items():
            replace_step_metric(metrics, name, value)
        return result

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        try:
            out = super()._generate_and_score_completions(inputs)
            width = out["completion_ids"].shape[1]
            out.update({key: _pad_to(value, width) for key, value in self._tree.items()})
        finally:
            self._tree = None
        mode = "train" if self.model.training else "eval"
        correct = None
        if all(GOLD_COLUMN in row for row in inputs):
            timeout = self.args.reward_config().timeout_s
            texts = [trajectory_text(t, self.fmt) for t in self._trajectories]
            graded = gather_object([_graded(text, row[GOLD_COLUMN], timeout) for text, row in zip(texts, inputs)])
            correct = None if None in graded else graded
        for name, value in rollout_metrics(self._gathered, correct).items():
            self._metrics[mode][f"threadweaver/{name}"].append(value)
        return out

    # Scoring ----------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        self._tree = {key: inputs[key] for key in TREE_KEYS}
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._tree = None

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """Per completion token, its log-prob from its trie parent's logits under the tree mask.

        Only the last ``logits_to_keep + 1`` positions get logits: every completion token's parent is
        the prompt's last token or a completion token. They are read a chunk at a time
        (:func:`~threadweaver.trl_pgrpo.scoring.parent_logps`), never copied whole.
        """
        if self._tree is None:
            raise RuntimeError("PGRPOTrainer scores only the trie rows of its own rollouts")
        if any(value is not None for value in multimodal.values()):
            raise ValueError("PGRPOTrainer does not train multimodal inputs")
        rows_in_batch, length = input_ids.shape
        prompt_width = length - logits_to_keep
        batch_size = batch_size or rows_in_batch
        logps, entropies = [], []
        kept = logits_to_keep + 1
        for start in range(0, rows_in_batch, batch_size):
            rows = slice(start, start + batch_size)
            parent, position, end = _row_layout(self._tree, rows, attention_mask[rows], prompt_width)
            batch = {"input_ids": input_ids[rows], "attention_mask": attention_mask[rows], "position_ids": position}
            with self.accelerator.autocast():
                logits = model(**batch, subtree_end=end, fused_lm_head=False, logits_to_keep=kept).logits
            logits = logits[:, -kept:]  # a model that ignores logits_to_keep gives every position's
            scored = parent_logps(
                logits,
                parent[:, prompt_width:] - (length - kept),
                input_ids[rows, prompt_width:],
                self.temperature,
                entropy=compute_entropy,
            )
            logps.append(scored[0])
            entropies.append(scored[1])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None


def _warn_half_precision(model, learning_rate: float) -> None:
    """A policy whose trained weights are half precision barely moves: AdamW's steps of about the learning
    rate round away on them (one step on the kit in bf16 moved 1.4% of its weights)."""
    half = {p.dtype for p in model.parameters() if p.requires_grad} & {torch.bfloat16, torch.float16}
    if half:
        warnings.warn(
            f"PGRPOTrainer: the policy's trained weights are {min(map(str, half))}, on which AdamW's steps of about "
            f"the learning rate ({learning_rate:g}) round away, so it barely trains; load it with "
            "dtype=torch.float32 (bf16=True trains it under autocast)",
            stacklevel=3,
        )


def problem_dataset(dataset, name: str, gold: bool):
    """``dataset`` checked for P-GRPO's columns before any rollout, ``messages`` rows given their ``prompt``.

    A row needs a ``prompt`` (a string, or chat messages, as TRL's GRPOTrainer takes) or ``messages``
    (whose turns before the trailing assistant turns are the prompt; read first where a row has both, as
    :class:`~threadweaver.rows.RowReader` and ``threadweaver pgrpo`` read rows), and, when ``gold`` (a
    reward grades against it), the gold answer in ``answer``. A dict of datasets (an ``eval_dataset``) is
    checked one by one; a dataset whose columns are not known without reading it (an ``IterableDataset``
    without features) is checked row by row as it streams.
    """
    if isinstance(dataset, dict):
        return {key: problem_dataset(value, f"{name}[{key!r}]", gold) for key, value in dataset.items()}
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list):  # an IterableDataset without features: its rows are read as they stream
        return _with_prompt(dataset, name) if hasattr(dataset, "map") else dataset
    missing = []
    if "prompt" not in columns and "messages" not in columns:
        missing.append(
            "a 'prompt' column (a string, or a list of chat messages, as TRL's GRPOTrainer takes) or a "
            "'messages' column (a conversation; its turns before the final assistant turn are the prompt)"
        )
    if gold and GOLD_COLUMN not in columns:
        missing.append(
            f"an {GOLD_COLUMN!r} column (the gold answer the correctness reward grades against; "
            f"rename yours with .rename_column(NAME, {GOLD_COLUMN!r}))"
        )
    if missing:
        raise ValueError(f"{name} has the columns {columns}, but PGRPOTrainer needs {' and '.join(missing)}")
    return _with_prompt(dataset, name) if "messages" in columns else dataset


def _with_prompt(dataset, name: str):
    """Each ``messages`` row with its prompt turns as TRL's ``prompt`` column (a ``prompt`` is replaced); where
    the columns are known only as the rows stream, a row with neither is refused by name (TRL would stop on
    a bare ``KeyError: 'prompt'``)."""

    def prompt(row: dict, index: int) -> dict:
        if "messages" not in row:
            if "prompt" not in row:
                raise ValueError(f"{name} row {index} has the fields {sorted(row)}, but no 'prompt' or 'messages'")
            return {}
        try:
            return {"prompt": prompt_messages(row["messages"])}
        except ValueError as err:
            raise ValueError(f"{name} row {index}: {err}") from None

    return dataset.map(prompt, with_indices=True)


def _without_tokens(trajectory: Trajectory) -> Trajectory:
    """What the logs need of a rollout (stats, faults, finish reason), small enough to gather."""
    return dataclasses.replace(trajectory, prompt_ids=(), token_ids=(), generated=(), nodes=(), requests=(), calls=())


def _tree_tensors(rows: list[TrieRow], device) -> dict[str, torch.Tensor]:
    width = max(len(r.completion_ids) for r in rows)
    out = {key: torch.zeros((len(rows), width), dtype=torch.long) for key in TREE_KEYS}
    for b, row in enumerate(rows):
        n = len(row.completion_ids)
        out["tree_parent"][b, :n] = torch.tensor(row.parent)
        out["tree_position"][b, :n] = torch.tensor(row.position_ids)
        out["tree_end"][b, :n] = torch.tensor(row.subtree_end)
    return {key: value.to(device) for key, value in out.items()}


def _pad_to(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1])) if tensor.shape[1] < width else tensor


def _row_layout(tree: dict[str, torch.Tensor], rows: slice, attention_mask: torch.Tensor, prompt_width: int):
    """(parent, position_ids, subtree_end) over TRL's row layout: left-padded prompt, right-padded completion.

    Trie indices count from the row's first prompt token, so they shift by the row's left
    padding. A padding position is its own parent, at depth 0, and visible to itself only.
    """
    count, length = attention_mask.shape
    index = torch.arange(length, device=attention_mask.device).expand(count, length)
    prompt_length = attention_mask[:, :prompt_width].sum(1, keepdim=True)
    completion_length = attention_mask[:, prompt_width:].sum(1, keepdim=True)
    offset = prompt_width - prompt_length
    in_prompt = (index >= offset) & (index < prompt_width)
    parent = torch.where(in_prompt & (index > offset), index - 1, index)
    position = torch.where(in_prompt, index - offset, 0)
    end = torch.where(in_prompt, prompt_width + completion_length, index + 1)
    completion = slice(prompt_width, None)
    in_completion = in_prompt.new_zeros(in_prompt.shape)
    in_completion[:, completion] = index[:, completion] < prompt_width + completion_length
    width = length - prompt_width
    tree_part = {key: _pad_to(value[rows], width)[:, :width] for key, value in tree.items()}
    parent[:, completion] = torch.where(
        in_completion[:, completion], offset + tree_part["tree_parent"], parent[:, completion]
    )
    position[:, completion] = torch.where(
        in_completion[:, completion], tree_part["tree_position"], position[:, completion]
    )
    end[:, completion] = torch.where(in_completion[:, completion], offset + tree_part["tree_end"], end[:, completion])
    return parent, position, end


def _graded(text: str, gold, timeout_s: float) -> bool | None:
    """Whether ``text`` answers ``gold``; None where ``gold`` is no answer (:func:`answer_text`: null, NaN; the
    rewards are then the user's own, and no correct_rate is logged: as text, \\boxed{None} would match it)."""
    try:
        return is_correct(text, answer_text(gold), timeout_s)
    except ValueError:
        return None
