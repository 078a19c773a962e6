"""Tree attention on a GPU: a Qwen3-0.6B-shaped model on trie rows, causal against the trie.

    python bench/tree_attention_gpu.py [--sizes 4096 16384 32768 65536] [--out runs/tree_attention_gpu.json]
    python bench/tree_attention_gpu.py --thread-tokens 1000   # threads of 1,000 tokens (default 100)
    python bench/tree_attention_gpu.py --mixed-precision   # float32 weights under bf16 autocast, as sft trains
    python bench/tree_attention_gpu.py --smoke     # CPU: tiny shape, in a minute

One run prints, side by side, for trie rows of bench/collator.py's trajectory (synth token
ids; the model is built from Qwen3-0.6B's config with random weights, bf16, no download):

* full model, forward+backward (median of 3 after 2 warm-ups) and peak memory, through the
  project's own hook (``use_tree_attention``), on the same tokens:
  - ``causal``: plain causal ``sdpa`` (flash), the speed to beat;
  - ``threadweaver_varlen``: the trie as two calls of flash's varlen kernel, merged by their
    log-sum-exps (plugins/hf_collator/segments.py);
  - ``threadweaver_flex``: the causal head on flash, the branches on FlexAttention;
  - ``whole-tree flex``: every query through one FlexAttention ``BlockMask`` (how
    ``threadweaver_flex`` ran before the split);
  - ``threadweaver_flex FA4``: ``use_tree_attention(model, "flex_attention", kernel_options=
    {"BACKEND": "FLASH"})``, the whole tree on FlexAttention's FLASH backend (FlashAttention 4
    through CuTe DSL), where ``flash_attn.cute`` is installed (bench/gpu_wheels.sh carries it to a
    machine without a network); skipped, and said, elsewhere;
  - ``threadweaver_sdpa``: the dense-mask oracle (up to ``--dense-max`` tokens);
  where the predicted peak would not fit, gradient checkpointing and a chunked cross-entropy
  (the logits are most of the memory: 151,936 x N floats), said in the table;
* agreement of ``threadweaver_varlen`` and ``threadweaver_flex`` with the dense oracle (loss and
  gradient cosine), and of the chunked cross-entropy with the model's own loss;
* the attention kernel alone (q 16 heads, k/v 8, head dim 128, bf16, forward+backward, laid
  out in memory as the model lays them out: tokens before heads):
  flash causal (sdpa held to its flash kernel, FA2), causal sdpa on the kernel torch picks
  itself, flex with a causal and with the trie ``BlockMask``, the split, the trie on
  flash's varlen kernel, the trie ``BlockMask`` on the FLASH backend (where it runs), the mask
  and plan build times, and the error against float32 attention under the
  dense mask; then
  FlexAttention ``kernel_options`` tried on the split at the sweep size, and the full
  model again with the fastest of them where it beats the default by 3%;
* a batch of four rows of different lengths (``--packed-size`` tokens in all), padded to the
  longest against packed into one row (``TrieCollator(padding_free=True)``), on
  ``threadweaver_flex``, and causal over the packed tokens as one sequence;
* last, the full model at each of ``--compile-sizes`` with each decoder layer compiled (regional
  compilation), causal against ``threadweaver_flex`` (whole trie on one BlockMask under compile)
  and its FA4 arm.
  Each timed arm also gives the host's time to queue its step: well below the step's own time,
  the GPU is the bound (near it, launches may be, or a full launch queue made the host wait).

Phases past ``--budget-s`` seconds are skipped and say so; the JSON is rewritten after each
phase, so a run cut short keeps what it measured. ``--smoke`` runs on CPU with a tiny shape:
FlexAttention has no CPU backward (its arms run forward only there) and runs eagerly (inductor
would take a minute to compile it), so the smoke checks the plumbing, not the speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rope_theta=1_000_000,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
"""Qwen3-0.6B's config.json, the fields that set the cost."""
TINY = QWEN3_06B | dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
"""The smoke's shape: Qwen3's, small."""
KERNEL_OPTIONS = {
    "default": {},
    "TMA": {"USE_TMA": True},
    "fwd 128x128, 2 stages, 8 warps": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_stages": 2, "fwd_num_warps": 8},
    "bwd 64x64, 3 stages, 4 warps": {
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 64,
        "bwd_BLOCK_M2": 64,
        "bwd_BLOCK_N2": 64,
        "bwd_num_stages": 3,
        "bwd_num_warps": 4,
    },
}
"""FlexAttention kernel options tried on the split's branch part (torch's defaults for Hopper first)."""
WHOLE_TREE_FLEX = "bench_whole_tree_flex"
ERROR_MAX_TOKENS = 16384
"""The kernels' error is measured against float32 attention under the dense mask, [heads, N, N]: up to here."""
BACKENDS = {"threadweaver_varlen": "varlen", "threadweaver_flex": "flex_attention", "threadweaver_sdpa": "sdpa"}
FA4 = " FA4"
"""An arm's name ending so runs FlexAttention on its FLASH backend (FlashAttention 4 through CuTe DSL)."""
FA4_OPTIONS = {"BACKEND": "FLASH"}
ARMS = (
    "causal",
    "threadweaver_varlen",
    "threadweaver_flex",
    "whole-tree flex",
    "threadweaver_flex" + FA4,
    "threadweaver_sdpa",
)
SHORT_NAMES = {
    "causal": "causal",
    "threadweaver_varlen": "varlen",
    "threadweaver_flex": "flex",
    "whole-tree flex": "whole",
    "threadweaver_flex" + FA4: "flex FA4",
    "threadweaver_sdpa": "dense",
}
"""Each arm's column in the printed table."""
PEAK_ARMS = (
    "causal",
    "threadweaver_varlen",
    "threadweaver_flex",
    "whole-tree flex",
    "threadweaver_flex" + FA4,
    "threadweaver_sdpa",
)
"""The arms whose peak memory the table shows."""


class Bench:
    """The run's clock, budget and results file."""

    def __init__(self, budget_s: float, out: Path | None, smoke: bool, thread_tokens: int):
        self.start, self.budget_s, self.out = time.perf_counter(), budget_s, out
        self.thread_tokens = thread_tokens
        self.results: dict = {}
        self.model_timing = (1, 1) if smoke else (2, 3)
        """Full model: (warm-ups, timed runs); the median is reported."""
        self.kernel_timing = (1, 1) if smoke else (2, 5)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over_budget(self) -> bool:
        return self.elapsed() > self.budget_s

    def save(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        if self.out is not None:
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.results, indent=1))
            tmp.replace(self.out)


def fa4_missing(device: torch.device) -> str | None:
    """Why the FLASH backend cannot run here, or None where it can (bench/gpu_wheels.sh carries it to a
    machine without a network)."""
    from threadweaver.hf_collator.attention import flash_attention_4_missing

    return "FlashAttention 4 needs CUDA" if device.type != "cuda" else flash_attention_4_missing()


def failure(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def trie_batch(size: int, device: torch.device, width: int) -> dict[str, torch.Tensor]:
    """One trie row of about ``size`` tokens of bench/collator.py's trajectory, threads of ``width``, on ``device``."""
    return collated([(size, width)], device)


def rows_batch(sizes: list[int], device: torch.device, width: int, padding_free: bool) -> dict[str, torch.Tensor]:
    """A trie row for each of ``sizes``, padded to the longest or ``padding_free``, threads of ``width``
    or, where the row is shorter than ten of them, of a tenth of the row (a row holds one block at least)."""
    return collated([(size, min(width, size // 10)) for size in sizes], device, padding_free)


def collated(rows: list[tuple[int, int]], device: torch.device, padding_free: bool = False) -> dict[str, torch.Tensor]:
    """``TrieCollator``'s batch of bench/collator.py's rows, each (tokens, thread width), on ``device``."""
    sys.path.insert(0, str(Path(__file__).parent))
    from collator import row

    from threadweaver.hf_collator import TrieCollator
    from threadweaver.kit.tokenizers import synth_tokenizer

    batch = TrieCollator(synth_tokenizer(), padding_free=padding_free)([row(*shape) for shape in rows])
    return {k: v.to(device) for k, v in batch.items()}


def pair_shares(subtree_end: torch.Tensor) -> dict[str, float]:
    """Visible pairs and the causal head's pairs, as shares of the causal pairs (O(N))."""
    from threadweaver.hf_collator.attention import causal_head

    end = subtree_end[0].long()
    n = end.shape[0]
    causal = n * (n + 1) / 2
    head = causal_head(subtree_end)
    visible = (end - torch.arange(n, device=end.device)).sum().item()
    return {"visible": visible / causal, "head_tokens": head / n, "head_pairs": head * (head + 1) / 2 / causal}


# --- the full model ---------------------------------------------------------------------------


def build_model(shape: dict, device: torch.device, mixed_precision: bool):
    """bf16 weights on a GPU; float32 on CPU, and under ``mixed_precision``, where ``step`` runs them
    under bf16 autocast."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape, max_position_embeddings=131072, attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" and not mixed_precision else torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.bench_mixed_precision = mixed_precision
    return model.train()


def register_whole_tree_flex() -> None:
    """``threadweaver_flex`` as it ran before the split: every query through one trie BlockMask."""
    from transformers import AttentionInterface
    from transformers.integrations.flex_attention import flex_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    from threadweaver.hf_collator.attention import tree_block_mask

    cache: dict = {}

    def whole_tree_flex(module, query, key, value, attention_mask, subtree_end=None, **kwargs):
        if cache.get("end") is not subtree_end:
            cache.update(end=subtree_end, mask=tree_block_mask(subtree_end))
        return flex_attention_forward(module, query, key, value, cache["mask"], **kwargs)

    AttentionInterface.register(WHOLE_TREE_FLEX, whole_tree_flex)
    AttentionMaskInterface.register(WHOLE_TREE_FLEX, lambda **kwargs: None)


def base_arm(arm: str) -> tuple[str, dict | None]:
    """(the attention arm, FlexAttention kernel options): an FA4 arm is its base on the FLASH backend."""
    return (arm.removesuffix(FA4), FA4_OPTIONS) if arm.endswith(FA4) else (arm, None)


def set_arm(model, arm: str) -> None:
    """The arm's attention, as a user sets it: an FA4 arm's options go on the model through
    ``use_tree_attention`` (and forward kwargs, the tuned arm's, take precedence over them)."""
    from threadweaver.hf_collator import use_tree_attention

    arm, options = base_arm(arm)
    if arm == "causal":
        model.set_attn_implementation("sdpa")
    elif arm == "whole-tree flex":
        model.set_attn_implementation(WHOLE_TREE_FLEX)
    else:
        use_tree_attention(model, BACKENDS[arm], kernel_options=options or {})


def arm_inputs(batch: dict, arm: str) -> dict:
    """The causal arm sees the same tokens as one sequence: positions 0..N-1, no tree.

    (Given the trie's depths as ``position_ids``, transformers would read every drop in them
    as the start of another packed sequence and build a dense block mask instead.)
    """
    inputs = {k: v for k, v in batch.items() if k != "attention_mask"}
    if base_arm(arm)[0] == "causal":
        inputs.pop("subtree_end")
        inputs.pop("position_ids")
    return inputs


def chunked_loss(model, inputs: dict, extra: dict, chunk: int = 8192) -> torch.Tensor:
    """The model's causal-LM loss, the logits made and dropped a chunk at a time (recomputed in backward)."""
    from torch.utils.checkpoint import checkpoint

    features = {k: v for k, v in inputs.items() if k != "labels"}
    hidden = model.model(**features, **extra).last_hidden_state[:, :-1]
    targets = inputs["labels"][:, 1:]
    weight = model.lm_head.weight

    def chunk_loss(h, y):
        logits = torch.nn.functional.linear(h, weight).float()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")

    total = sum(
        checkpoint(chunk_loss, hidden[:, i : i + chunk], targets[:, i : i + chunk], use_reentrant=False)
        for i in range(0, targets.shape[1], chunk)
    )
    return total / (targets != -100).sum()


def precision(model, device: torch.device):
    """The forward's autocast: bf16 under the model's mixed precision, off otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=model.bench_mixed_precision)


def logits_dtype(model, device: torch.device) -> str:
    """What the model's forward computes its logits in, under ``precision``: bf16 where it is mixed."""
    with torch.no_grad(), precision(model, device):
        return str(model(input_ids=torch.zeros(1, 8, dtype=torch.long, device=device)).logits.dtype)


MEMORY_SAVING = ("none", "chunked CE", "checkpointing + chunked CE")
"""From least to most: the chunked loss never makes the logits whole; checkpointing recomputes layers."""


def step(model, inputs: dict, backward: bool, kernel_options: dict | None, memory_saving: str) -> torch.Tensor:
    """One forward (+backward); under the model's mixed precision, the forward runs in bf16 autocast, as
    accelerate runs it for TRL's ``--bf16``."""
    extra = {"kernel_options": kernel_options} if kernel_options else {}

    def loss():
        with precision(model, inputs["input_ids"].device):
            if memory_saving == "none":
                return model(**inputs, **extra).loss
            return chunked_loss(model, inputs, extra)

    if not backward:
        with torch.no_grad():
            return loss()
    model.zero_grad(set_to_none=True)
    value = loss()
    value.backward()
    return value.detach()


def set_checkpointing(model, memory_saving: str) -> None:
    if memory_saving.startswith("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def time_arm(model, batch, arm, device, warmups, repeats, memory_saving, kernel_options=None) -> dict:
    """:func:`time_arm_once`; an FA4 arm that fails, once more with static shapes: FlashAttention 4 had
    run with static ones only, and a size after the first recompiles with dynamic shapes. Then the
    retry's timing with the first failure, or both failures."""
    timing = (model, batch, arm, device, warmups, repeats, memory_saving, kernel_options)
    result = time_arm_once(*timing)
    if "error" not in result or not arm.endswith(FA4):
        return result
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        torch._dynamo.reset()
        retry = time_arm_once(*timing)
    if "seconds" in retry:
        return {**retry, "retried with static shapes after": result["error"]}
    return {**result, "static shapes error": retry["error"]}


def time_arm_once(model, batch, arm, device, warmups, repeats, memory_saving, kernel_options=None) -> dict:
    """Median seconds of forward+backward (forward only for flex on CPU) and peak GiB.

    ``issue_seconds``: until the host has queued the step, before waiting for the GPU. Well below
    ``seconds``, the GPU is the bound; near it, either Python and kernel launches are, or the
    launch queue filled up and made the host wait: the compiled phase tells the two apart.
    """
    set_arm(model, arm)
    backward = device.type == "cuda" or "flex" not in arm
    inputs = arm_inputs(batch, arm)
    times, issued = [], []
    try:
        for i in range(warmups + repeats):
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            step(model, inputs, backward, kernel_options, memory_saving)
            issue = time.perf_counter() - start
            sync(device)
            if i >= warmups:
                times.append(time.perf_counter() - start)
                issued.append(issue)
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {"error": "out of memory"}
    except Exception as err:  # one arm's failure is a result, not the end of the run
        traceback.print_exc()
        model.zero_grad(set_to_none=True)
        return {"error": failure(err)}
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    model.zero_grad(set_to_none=True)
    return {
        "seconds": statistics.median(times),
        "issue_seconds": statistics.median(issued),
        "peak_gib": peak,
        "backward": backward,
    }


def agreement(model, batch, device, arms: list[str]) -> dict:
    """``threadweaver_varlen`` and ``threadweaver_flex`` (and on FA4, where it runs), those of ``arms``,
    against the dense oracle (loss difference, gradient cosine; flex forward only on CPU), and the
    chunked loss against the model's own. An arm that fails says so and the others go on."""

    def loss_and_grad(arm: str) -> tuple[float, torch.Tensor | None]:
        backward = device.type == "cuda" or "flex" not in arm
        set_arm(model, arm)
        loss = step(model, arm_inputs(batch, arm), backward, None, "none").float().item()
        if not backward:
            return loss, None
        grad = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
        return loss, grad

    dense, dense_grad = loss_and_grad("threadweaver_sdpa")
    set_arm(model, "threadweaver_sdpa")
    with torch.no_grad():  # in chunks shorter than the row
        chunked = chunked_loss(model, arm_inputs(batch, "threadweaver_sdpa"), {}, chunk=1000).float().item()
    out = {"loss_dense": dense, "chunked_loss_difference": abs(chunked - dense)}
    compared = [arm for arm in ("threadweaver_varlen", "threadweaver_flex") if arm in arms]
    if fa4_missing(device) is None and "threadweaver_flex" + FA4 in arms:
        compared.append("threadweaver_flex" + FA4)
    for arm in compared:
        try:
            loss, grad = loss_and_grad(arm)
        except Exception as err:  # one arm's failure is a result
            traceback.print_exc()
            model.zero_grad(set_to_none=True)
            out[f"{arm} error"] = failure(err)
            continue
        out[f"{arm} loss_difference"] = abs(loss - dense)
        if grad is not None:
            out[f"{arm} gradient_cosine"] = (dense_grad @ grad / (dense_grad.norm() * grad.norm())).item()
    return out


def memory_saving_for(tokens: int, reference: dict | None, vocab: int, device: torch.device) -> str:
    """The least memory saving under which the predicted peak stays within 75% of the card.

    The peak is predicted from the causal arm at the first size: weights and gradients, the
    logits (bf16, their float32 copy and its gradient: 10 bytes a logit) and activations in
    proportion to the tokens. On CPU (the smoke) every size after the first takes the most,
    so that the smoke runs that path too.
    """
    if reference is None:
        return MEMORY_SAVING[0]
    if device.type != "cuda":
        return MEMORY_SAVING[-1]
    gib, fixed = 2**30, reference["params_gib"] * 2
    logits = reference["tokens"] * vocab * 10 / gib
    per_token = (reference["peak_gib"] - fixed - logits) / reference["tokens"]
    room = 0.75 * torch.cuda.get_device_properties(device).total_memory / gib
    if fixed + (per_token + vocab * 10 / gib) * tokens < room:
        return MEMORY_SAVING[0]
    if fixed + per_token * tokens + 8192 * vocab * 10 / gib < room:
        return MEMORY_SAVING[1]
    return MEMORY_SAVING[2]


def full_model(bench: Bench, args, device: torch.device, shape: dict):
    """The full-model table's default arms; returns the model for the tuned arm."""
    model = build_model(shape, device, args.mixed_precision)
    bench.results["logits_dtype"] = logits_dtype(model, device)
    register_whole_tree_flex()
    rows = bench.results.setdefault("full_model", [])
    reference = None
    warmups, repeats = bench.model_timing
    bench.results["full_model_timing"] = f"median of {repeats} after {warmups} warm-ups"
    for size in args.sizes:
        if bench.over_budget():
            rows.append({"size": size, "skipped": "time budget"})
            continue
        batch = trie_batch(size, device, bench.thread_tokens)
        tokens = batch["input_ids"].shape[1]
        memory_saving = memory_saving_for(tokens, reference, shape["vocab_size"], device)
        set_checkpointing(model, memory_saving)
        entry = {
            "size": size,
            "tokens": tokens,
            "memory_saving": memory_saving,
            **pair_shares(batch["subtree_end"]),
            "arms": {},
        }
        rows.append(entry)
        if size == args.sizes[0]:
            try:
                bench.results["agreement"] = {"tokens": tokens, **agreement(model, batch, device, args.arms)}
            except Exception as err:
                traceback.print_exc()
                bench.results["agreement"] = {"tokens": tokens, "error": failure(err)}
                model.zero_grad(set_to_none=True)
        arms = [a for a in args.arms if a != "threadweaver_sdpa" or tokens <= args.dense_max]
        for arm in arms:
            if bench.over_budget():
                entry["arms"][arm] = {"skipped": "time budget"}
                continue
            if arm.endswith(FA4) and fa4_missing(device):
                entry["arms"][arm] = {"skipped": fa4_missing(device)}
                continue
            entry["arms"][arm] = time_arm(model, batch, arm, device, warmups, repeats, memory_saving)
            print(f"[{bench.elapsed():.0f} s, full model] {tokens} tokens, {arm}: {entry['arms'][arm]}", flush=True)
            bench.save()
        if reference is None and "seconds" in entry["arms"].get("causal", {}):
            params = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
            reference = {"tokens": tokens, "params_gib": params, **entry["arms"]["causal"]}
        del batch
    return model


PACKED_ROWS = (1 / 2, 1 / 4, 1 / 8, 1 / 8)
"""A batch's rows, as shares of ``--packed-size``: each row is padded to the longest, twice the tokens."""


PACKED_ARMS = (
    ("causal, one sequence", "packed", "causal"),
    ("flex, padded", "padded", "threadweaver_flex"),
    ("flex, packed", "packed", "threadweaver_flex"),
)
"""(name, batch layout, attention arm) of the packed phase."""


def packed_batch(bench: Bench, args, device: torch.device, model) -> None:
    """Rows of different lengths in one batch, padded to the longest against packed into one row
    (``TrieCollator(padding_free=True)``): the same tokens under the same trees, without the padding's
    compute. Causal runs the packed tokens as one sequence."""
    if not args.packed_size:
        return
    entry = bench.results["packed"] = {"size": args.packed_size}
    if bench.over_budget():
        entry["skipped"] = "time budget"
        return
    sizes = [int(args.packed_size * share) for share in PACKED_ROWS]
    batches = {
        "padded": rows_batch(sizes, device, bench.thread_tokens, padding_free=False),
        "packed": rows_batch(sizes, device, bench.thread_tokens, padding_free=True),
    }
    entry["tokens"] = {name: list(batch["input_ids"].shape) for name, batch in batches.items()}
    set_checkpointing(model, MEMORY_SAVING[0])
    warmups, repeats = bench.model_timing
    entry["arms"], losses = {}, {}
    for name, layout, arm in PACKED_ARMS:
        if bench.over_budget():
            entry["arms"][name] = {"skipped": "time budget"}
            continue
        batch = batches[layout]
        result = entry["arms"][name] = time_arm(model, batch, arm, device, warmups, repeats, MEMORY_SAVING[0])
        if "seconds" in result and arm != "causal":
            losses[name] = step(model, arm_inputs(batch, arm), False, None, MEMORY_SAVING[0]).float().item()
        print(f"[{bench.elapsed():.0f} s, packed] {entry['tokens'][layout]}, {name}: {result}", flush=True)
        bench.save()
    if len(losses) == 2:
        entry["loss_difference_packed_from_padded"] = abs(losses["flex, packed"] - losses["flex, padded"])


COMPILED_ARMS = ("causal", "threadweaver_flex", "threadweaver_flex" + FA4)
"""Under compile ``threadweaver_flex`` runs the whole trie on one BlockMask (plugins/hf_collator/attention.py)."""


def compiled_model(bench: Bench, args, device: torch.device, model) -> None:
    """The full model again with each decoder layer compiled (regional compilation, inductor; on
    CPU ``aot_eager``, which only traces): Python and launch overhead leave both arms. Last, as
    compiling changes the model for good; the dense mask's losses, the trie arms' reference, first.

    Each size takes the full model's memory saving for it (none where that phase did not run it).
    The layers compile once, as a training run compiles them: the first size's shapes are static,
    and torch recompiles the later ones with dynamic shapes, as it does for rows of another length.
    """
    entries = bench.results["compiled"] = []
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    saving = {}
    for e in bench.results.get("full_model", []):  # the first row of a size (the smoke runs one twice)
        saving.setdefault(e["size"], e.get("memory_saving"))
    batches, dense = {}, {}
    set_arm(model, "threadweaver_sdpa")
    for size in args.compile_sizes:
        entry = {"size": size, "backend": backend, "memory_saving": saving.get(size) or MEMORY_SAVING[0]}
        entry["shapes"] = "dynamic" if entries else "static"
        entries.append(entry)
        if bench.over_budget():
            entry["skipped"] = "time budget"
            continue
        batches[size] = batch = trie_batch(size, device, bench.thread_tokens)
        entry["tokens"] = batch["input_ids"].shape[1]
        set_checkpointing(model, entry["memory_saving"])
        try:
            loss = step(model, arm_inputs(batch, "threadweaver_sdpa"), False, None, entry["memory_saving"])
            dense[size] = loss.float().item()
        except Exception as err:
            traceback.print_exc()
            entry["dense_error"] = failure(err)
    if batches:
        for layer in model.model.layers:
            layer.compile(backend=backend)
    for entry in entries:
        if entry["size"] in batches:
            set_checkpointing(model, entry["memory_saving"])
            arms = [arm for arm in COMPILED_ARMS if arm == "causal" or arm in args.arms]
            compiled_arms(bench, entry, model, batches[entry["size"]], device, dense.get(entry["size"]), arms)


def compiled_arms(bench: Bench, entry: dict, model, batch: dict, device, dense: float | None, arms: list) -> None:
    from torch._dynamo.utils import counters

    warmups, repeats, saving = *bench.model_timing, entry["memory_saving"]
    entry["arms"] = {}
    for arm in arms:
        skipped = "time budget" if bench.over_budget() else arm.endswith(FA4) and fa4_missing(device)
        if skipped:
            entry["arms"][arm] = {"skipped": skipped}
            continue
        start = bench.elapsed()
        counters.clear()
        result = time_arm(model, batch, arm, device, warmups, repeats, saving)
        result["with_compile_s"] = round(bench.elapsed() - start, 1)
        result["graph_breaks"] = sum(counters["graph_break"].values())  # a break times a partly eager model
        if "seconds" in result and arm != "causal" and dense is not None:
            try:
                loss = step(model, arm_inputs(batch, arm), False, None, saving)
                result["loss_difference_from_dense"] = abs(loss.float().item() - dense)
            except Exception as err:  # the timing stands
                traceback.print_exc()
                result["loss_error"] = failure(err)
        entry["arms"][arm] = result
        print(f"[{bench.elapsed():.0f} s, compiled] {entry['tokens']} tokens, {arm}: {result}", flush=True)
        bench.save()


def tuned_full_model(bench: Bench, model, device: torch.device, options_name: str) -> None:
    """The full model again with the sweep's fastest kernel options, where they beat the default."""
    options = KERNEL_OPTIONS[options_name]
    for entry in bench.results["full_model"]:
        if "tokens" not in entry:
            continue
        arm = f"threadweaver_flex + {options_name}"
        if bench.over_budget():
            entry["arms"][arm] = {"skipped": "time budget"}
            continue
        batch = trie_batch(entry["size"], device, bench.thread_tokens)
        set_checkpointing(model, entry["memory_saving"])
        entry["arms"][arm] = time_arm(
            model,
            batch,
            "threadweaver_flex",
            device,
            *bench.model_timing,
            entry["memory_saving"],
            kernel_options=options,
        )
        print(
            f"[{bench.elapsed():.0f} s, full model] {entry['tokens']} tokens, {arm}: {entry['arms'][arm]}", flush=True
        )
        bench.save()


# --- the attention kernel alone ---------------------------------------------------------------


def median_ms(fn: Callable[[], None], device: torch.device, warmups: int, repeats: int) -> float:
    times = []
    for i in range(warmups + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - t) * 1e3
        if i >= warmups:
            times.append(elapsed)
    return statistics.median(times)


class Kernels:
    """The attention kernels on one trie row's ``subtree_end``: forward+backward (forward only on CPU)."""

    def __init__(self, subtree_end: torch.Tensor, shape: dict, device: torch.device, timing: tuple[int, int]):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        from threadweaver.hf_collator.attention import _compiled_create_block_mask, split_tree_mask, tree_block_mask
        from threadweaver.hf_collator.segments import trie_plan

        self.device, self.end, self.timing = device, subtree_end, timing
        self.n = n = subtree_end.shape[-1]
        cuda = device.type == "cuda"
        self.backward = cuda
        self.flex = torch.compile(flex_attention) if cuda else flex_attention
        # The FLASH backend is written for static shapes (the split's and the whole tree's differ).
        self.flex_static = torch.compile(flex_attention, dynamic=False) if cuda else flex_attention
        build = _compiled_create_block_mask() if cuda else create_block_mask
        self.causal_mask = build(lambda b, h, q, kv: kv <= q, 1, None, n, n, device=device)
        self.tree_mask = tree_block_mask(subtree_end)
        self.split = split_tree_mask(subtree_end)
        self.plan = trie_plan(subtree_end)
        dtype = torch.bfloat16 if cuda else torch.float32
        g = torch.Generator(device=device).manual_seed(0)
        heads, kv_heads, dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]

        def tensor(h: int, grad: bool) -> torch.Tensor:
            """[1, h, n, dim] laid out as the model lays it out: [1, n, h, dim] in memory, transposed."""
            x = torch.randn(1, n, h, dim, device=device, dtype=dtype, generator=g).transpose(1, 2)
            return x.requires_grad_(grad)

        self.q, self.k, self.v = tensor(heads, cuda), tensor(kv_heads, cuda), tensor(kv_heads, cuda)
        self.grad = tensor(heads, False)
        self.flash_only = True
        try:
            with torch.no_grad():
                self.flash_causal(self.q, self.k, self.v)
        except RuntimeError:  # no flash kernel for these inputs here: sdpa's own choice, said in the results
            self.flash_only = False

    def flash_causal(self, q, k, v):
        """Causal sdpa as transformers calls it (grouped heads); the flash kernel where it takes them."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.FLASH_ATTENTION] if self.flash_only else list(SDPBackend)
        with sdpa_kernel(backends):
            return self.sdpa_causal(q, k, v)

    def sdpa_causal(self, q, k, v):
        """Causal sdpa on the kernel torch picks itself, as the model's ``sdpa`` runs it."""
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def compiled(self, options):
        return self.flex_static if options == FA4_OPTIONS else self.flex

    def flex_with(self, mask, options=None):
        flex = self.compiled(options)
        return lambda q, k, v: flex(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=options or None)

    def split_attention(self, options=None):
        head, branches, flex = self.split.head, self.split.branches, self.compiled(options)

        def run(q, k, v):
            out = self.flash_causal(q[:, :, :head], k[:, :, :head], v[:, :, :head])
            if branches is None:
                return out
            rest = flex(q[:, :, head:], k, v, block_mask=branches, enable_gqa=True, kernel_options=options or None)
            return torch.cat([out, rest], dim=2)

        return run

    def trie_varlen(self, q, k, v):
        """``threadweaver_varlen``'s kernel: the [1, heads, n, dim] tensors as tokens, the plan's two calls."""
        from threadweaver.hf_collator.segments import trie_attention

        def tokens(x):
            return x.transpose(1, 2).reshape(self.n, x.shape[1], x.shape[-1])

        out = trie_attention(tokens(q), tokens(k), tokens(v), self.plan, q.shape[-1] ** -0.5)
        return out.view(1, self.n, q.shape[1], q.shape[-1]).transpose(1, 2)

    def time(self, attention) -> float:
        def run():
            for t in (self.q, self.k, self.v):
                t.grad = None
            if self.backward:
                attention(self.q, self.k, self.v).backward(self.grad)
            else:
                with torch.no_grad():
                    attention(self.q, self.k, self.v)

        return median_ms(run, self.device, *self.timing)

    def relative_error(self, attention) -> float:
        """||out - ref|| / ||ref|| against float32 attention under the dense trie mask."""
        from threadweaver.hf_collator.attention import tree_bool_mask

        with torch.no_grad():
            out = attention(self.q, self.k, self.v).float()
            q, k, v = (t.detach().float() for t in (self.q, self.k, self.v))
            ref = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=tree_bool_mask(self.end), enable_gqa=True
            )
        return ((out - ref).norm() / ref.norm()).item()

    def mask_build_ms(self) -> float:
        from threadweaver.hf_collator.attention import split_tree_mask

        return median_ms(lambda: split_tree_mask(self.end), self.device, *self.timing)

    def plan_build_ms(self) -> float:
        from threadweaver.hf_collator.segments import trie_plan

        return median_ms(lambda: trie_plan(self.end), self.device, *self.timing)


def kernels(bench: Bench, args, device: torch.device, shape: dict) -> str:
    """The kernel table and the kernel-options sweep; returns the fastest options' name."""
    rows = bench.results.setdefault("kernel", [])
    for size in args.kernel_sizes:
        if bench.over_budget():
            rows.append({"size": size, "skipped": "time budget"})
            continue
        end = trie_batch(size, device, bench.thread_tokens)["subtree_end"]
        k = Kernels(end, shape, device, bench.kernel_timing)
        entry = {"tokens": k.n, **pair_shares(end), "backward": k.backward, "flash only": k.flash_only}
        rows.append(entry)
        try:
            entry["flash causal ms"] = k.time(k.flash_causal)
            entry["flex causal ms"] = k.time(k.flex_with(k.causal_mask))
            entry["flex trie ms"] = k.time(k.flex_with(k.tree_mask))
            entry["split ms"] = k.time(k.split_attention())
            entry["trie varlen ms"] = k.time(k.trie_varlen)
            entry["mask build ms"] = k.mask_build_ms()
            entry["plan build ms"] = k.plan_build_ms()
            if size == args.kernel_sizes[0] and k.n <= ERROR_MAX_TOKENS:
                entry["relative error, trie varlen"] = k.relative_error(k.trie_varlen)
                entry["relative error, split"] = k.relative_error(k.split_attention())
                entry["relative error, flex trie"] = k.relative_error(k.flex_with(k.tree_mask))
            entry["sdpa causal ms"] = k.time(k.sdpa_causal)  # last: where it fails, the others stand
        except Exception as err:
            traceback.print_exc()
            entry["error"] = failure(err)
        fa4_kernels(k, entry, measure_error=size == args.kernel_sizes[0] and k.n <= ERROR_MAX_TOKENS)
        print(f"[{bench.elapsed():.0f} s, kernel] {entry}", flush=True)
        bench.save()
    if args.profile_size and not bench.over_budget():
        bench.results["trie_varlen_profile"] = profile_trie_varlen(bench, args.profile_size, shape, device)
        print(bench.results["trie_varlen_profile"], flush=True)
        bench.save()
    if not args.sweep_size:
        return "default"
    sweep = bench.results.setdefault("kernel_options", {"tokens": None, "split ms": {}})
    end = trie_batch(args.sweep_size, device, bench.thread_tokens)["subtree_end"]
    k = Kernels(end, shape, device, bench.kernel_timing)
    sweep["tokens"] = k.n
    for name, options in KERNEL_OPTIONS.items():
        if bench.over_budget():
            sweep["split ms"][name] = "skipped: time budget"
            continue
        try:
            sweep["split ms"][name] = k.time(k.split_attention(options))
        except Exception as err:  # an option this torch does not take: record it and go on
            traceback.print_exc()
            sweep["split ms"][name] = f"error: {failure(err)}"
        print(f"[{bench.elapsed():.0f} s, kernel options] {name}: {sweep['split ms'][name]}", flush=True)
        bench.save()
    timed = {name: ms for name, ms in sweep["split ms"].items() if isinstance(ms, float)}
    return min(timed, key=timed.get) if timed else "default"


def fa4_kernels(k: Kernels, entry: dict, measure_error: bool) -> None:
    """The trie ``BlockMask`` on the FLASH backend, or why not; a failure is a result. (The split's
    query-offset mask failed to build there, torch 2.11: ``threadweaver_flex`` runs FA4 on the whole tree.)"""
    missing = fa4_missing(k.device)
    if missing:
        entry["FA4"] = missing
        return
    attention = k.flex_with(k.tree_mask, FA4_OPTIONS)
    try:
        entry[f"flex trie{FA4} ms"] = k.time(attention)
        if measure_error:
            entry[f"relative error, flex trie{FA4}"] = k.relative_error(attention)
    except Exception as err:
        traceback.print_exc()
        entry[f"flex trie{FA4} error"] = failure(err)


def profile_trie_varlen(bench: Bench, size: int, shape: dict, device: torch.device) -> str:
    """Where ``threadweaver_varlen``'s kernel time goes: the profiler's table of one forward+backward."""
    from torch.profiler import ProfilerActivity, profile

    k = Kernels(trie_batch(size, device, bench.thread_tokens)["subtree_end"], shape, device, bench.kernel_timing)
    k.time(k.trie_varlen)  # warm
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        k.time(k.trie_varlen)
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=14)
    return f"{k.n} tokens, {len(k.plan.local.cu_q) - 1} segments, shared keys {shared_keys(k.plan)}:\n{table}"


def shared_keys(plan) -> str:
    shared = plan.shared
    if shared is None:
        return "none"
    return f"{len(shared.key_index)} in {len(shared.cu_q) - 1} groups"


def flex_uncompiled() -> None:
    """The smoke's FlexAttention runs eagerly: inductor takes a minute to compile it for the CPU.

    transformers compiles it once, on first use, in a singleton; this fills the singleton in
    (for training mode, which the bench's model is in) with the eager function.
    """
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as integration

    integration.WrappedFlexAttention(training=True)._compiled_flex_attention = flex_attention


# --- the report ---------------------------------------------------------------------------------


def _s(arm: dict | None) -> str:
    if not arm:
        return "-"
    if "seconds" in arm:
        return f"{arm['seconds']:.3f} s" + ("" if arm["backward"] else " fwd")
    return arm.get("error") or arm.get("skipped") or "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gib(arm: dict | None) -> str:
    return f"{arm['peak_gib']:.1f}" if arm and arm.get("peak_gib") is not None else "-"


def _ratio(base: dict | None, arm: dict | None) -> str:
    if not base or not arm or "seconds" not in base or "seconds" not in arm or not arm["seconds"]:
        return "-"
    return f"{base['seconds'] / arm['seconds']:.2f}"


def report(results: dict) -> str:
    lines = [
        f"\n{results['device']}, torch {results['torch']}, transformers {results['transformers']}, {results['date']}"
    ]
    lines.append(f"model: {results['model']}")
    full = [e for e in results.get("full_model", []) if "tokens" in e]
    if full:
        tuned = sorted({a for e in full for a in e["arms"] if a.startswith("threadweaver_flex + ")})
        timing = results["full_model_timing"]
        lines.append(f"\nfull model, forward+backward ({timing}; 'fwd': forward only), speed against causal:")
        head = ["tokens", "visible", "memory saving", "causal"]
        head += [h for arm in ARMS[1:] for h in (SHORT_NAMES[arm], "x")]
        head += [h for a in tuned for h in (a.replace("threadweaver_flex + ", "flex + "), "x")]
        head += ["peak GiB " + "/".join(SHORT_NAMES[arm] for arm in PEAK_ARMS)]
        lines.append(" | ".join(head))
        for e in full:
            a = e["arms"]
            c = a.get("causal")
            cells = [str(e["tokens"]), f"{e['visible']:.2f}", e["memory_saving"], _s(c)]
            for arm in [*ARMS[1:], *tuned]:
                cells += [_s(a.get(arm)), _ratio(c, a.get(arm))]
            cells.append(" / ".join(_gib(a.get(x)) for x in PEAK_ARMS))
            lines.append(" | ".join(cells))
    if full:
        lines.append("\nhost time to queue the step, s (well below the step's time: bound by the GPU):")
        for e in full:
            timed = {a: r for a, r in e["arms"].items() if "issue_seconds" in r}
            issue = {SHORT_NAMES.get(a, a): round(r["issue_seconds"], 3) for a, r in timed.items()}
            lines.append(f"  {e['tokens']}, {e['memory_saving']}: {issue}")
    packed = results.get("packed", {})
    if packed.get("arms"):
        c = packed["arms"].get("causal, one sequence")
        shapes = packed["tokens"]
        lines.append(f"\nrows of one batch, padded {shapes['padded']} or packed {shapes['packed']}, against causal:")
        for name, r in packed["arms"].items():
            lines.append(f"  {name}: {_s(r)} | {_ratio(c, r)} | peak GiB {_gib(r)}")
        if "loss_difference_packed_from_padded" in packed:
            lines.append(f"  loss, packed against padded: {packed['loss_difference_packed_from_padded']:.2e}")
    for compiled in results.get("compiled", []):
        if not compiled.get("arms"):
            continue
        c = compiled["arms"].get("causal")
        how = f"{compiled['backend']}, {compiled['shapes']} shapes, memory saving: {compiled['memory_saving']}"
        lines.append(f"\neach layer compiled ({how}), {compiled['tokens']} tokens, against causal:")
        shown = ("issue_seconds", "with_compile_s", "graph_breaks", "loss_difference_from_dense")
        shown += ("retried with static shapes after",)
        for arm, r in compiled["arms"].items():
            extra = {k: v for k, v in r.items() if k in shown}
            lines.append(f"  {arm}: {_s(r)} | {_ratio(c, r)} | {extra}")
    if "agreement" in results:
        lines.append(f"\nagainst the dense mask: {results['agreement']}")
    kern = [e for e in results.get("kernel", []) if "flash causal ms" in e]
    if kern:
        lines.append("\nattention kernel alone, ms (forward+backward where 'backward'), speed against flash causal:")
        fast = ["flex trie", "split", "trie varlen", "flex trie" + FA4]
        columns = ["flash causal", "sdpa causal", "flex causal", *fast, "mask build", "plan build"]
        lines.append("tokens | head share | " + " | ".join(columns) + f" | speed of {', '.join(fast)} against flash")
        for e in kern:
            f = e["flash causal ms"]
            cells = [str(e["tokens"]), f"{e['head_pairs']:.2f}"] + [_ms(e.get(c + " ms")) for c in columns]
            cells.append(", ".join(_ms(f / e[c + " ms"] if e.get(c + " ms") else None) for c in fast))
            lines.append(" | ".join(cells))
            lines += [f"  {key}: {value}" for key, value in e.items() if key == "FA4" or key.endswith(" error")]
        errors = {k: v for k, v in kern[0].items() if k.startswith("relative error")}
        lines.append(f"against float32 attention under the dense mask at {kern[0]['tokens']}: {errors}")
    if "kernel_options" in results:
        sweep = results["kernel_options"]
        lines.append(f"\nkernel options on the split at {sweep['tokens']} tokens, ms:")
        lines += [f"  {name}: {ms if isinstance(ms, str) else f'{ms:.2f}'}" for name, ms in sweep["split ms"].items()]
    phases = results.get("full_model", []) + results.get("kernel", []) + results.get("compiled", [])
    skipped = [e["size"] for e in phases if "skipped" in e]
    if skipped:
        lines.append(f"\nskipped (time budget): sizes {skipped}")
    lines.append(f"\n{results.get('elapsed_s', 0):.0f} s in all")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 16384, 32768, 65536])
    parser.add_argument("--kernel-sizes", type=int, nargs="*", default=[8192, 32768, 65536])
    parser.add_argument(
        "--sweep-size", type=int, default=32768, help="Trie tokens of the kernel-options sweep (0: none)."
    )
    parser.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="The full model's arms (causal first)."
    )
    parser.add_argument(
        "--profile-size", type=int, default=32768, help="Trie tokens of the trie varlen profile (0: none)."
    )
    parser.add_argument(
        "--thread-tokens", type=int, default=100, help="Tokens in a thread of bench/collator.py's trajectory."
    )
    parser.add_argument(
        "--compile-sizes", type=int, nargs="*", default=[4096, 32768], help="Trie tokens of the compiled full model."
    )
    parser.add_argument(
        "--packed-size",
        type=int,
        default=8192,
        help="Trie tokens of a batch of four rows, padded against packed (padding_free; 0: none).",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="Float32 weights under bf16 autocast, as `threadweaver sft` trains (TRL's --bf16); else bf16 weights.",
    )
    parser.add_argument("--dense-max", type=int, default=32768, help="Largest row the dense-mask arm runs.")
    parser.add_argument("--budget-s", type=float, default=420, help="Skip the phases that start after this.")
    parser.add_argument("--out", type=Path, default=Path("runs/tree_attention_gpu.json"), help="Results (JSON).")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, small rows: checks the plumbing.")
    args = parser.parse_args(argv)

    import transformers

    import threadweaver.hf_collator  # noqa: F401  (registers the threadweaver_* attention)

    if args.smoke:
        device, shape = torch.device("cpu"), TINY
        # One row twice: the second time with the memory savers, so that the smoke runs them too.
        args.sizes, args.kernel_sizes, args.sweep_size, args.profile_size = [2048, 2048], [2048], 2048, 2048
        args.compile_sizes, args.packed_size = [2048], 2048
        flex_uncompiled()
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: run with --smoke on CPU")
    else:
        device, shape = torch.device("cuda"), QWEN3_06B
    # Every kernel-options variant and row size is another compile of FlexAttention.
    torch._dynamo.config.recompile_limit = 64

    args.out.parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.budget_s, args.out, args.smoke, args.thread_tokens)
    weights = "float32 under bf16 autocast" if args.mixed_precision else "bf16" if device.type == "cuda" else "float32"
    bench.results.update(
        device=torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
        torch=torch.__version__,
        transformers=transformers.__version__,
        date=date.today().isoformat(),
        thread_tokens=args.thread_tokens,
        mixed_precision=args.mixed_precision,
        model=("Qwen3-0.6B shape" if shape is QWEN3_06B else "tiny Qwen3")
        + f", random weights, {weights}, {shape['num_hidden_layers']} layers",
    )
    best = kernels(bench, args, device, shape)
    bench.results["fastest_kernel_options"] = best
    model = full_model(bench, args, device, shape)
    sweep = bench.results.get("kernel_options", {}).get("split ms", {})
    if best != "default" and isinstance(sweep.get("default"), float) and sweep[best] < 0.97 * sweep["default"]:
        tuned_full_model(bench, model, device, best)
    packed_batch(bench, args, device, model)
    compiled_model(bench, args, device, model)
    bench.save()
    print(report(bench.results))
    return bench.results


if __name__ == "__main__":
    main()
