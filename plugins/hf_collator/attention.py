"""Tree attention for transformers: the trie mask is built inside the forward, on the model's device.

A batch from :class:`~threadweaver.hf_collator.TrieCollator` carries ``subtree_end``
([batch, N] integers) instead of an N x N mask: key ``kv`` is visible to query ``q`` iff
``kv <= q < subtree_end[b, kv]``. Transformers passes extra forward kwargs down to the
attention function, so the functions registered here receive it and build the mask their
backend needs:

* ``threadweaver_sdpa``: a dense bool mask for ``scaled_dot_product_attention`` (CPU training);
* ``threadweaver_eager``: an additive float mask for the model's own eager attention;
* ``threadweaver_flex``: a :class:`SplitTreeMask`. Pre-order lays each row's first root-to-leaf
  path out first, and up to its leaf the tree mask is plain causal: those queries run the
  causal ``sdpa`` kernel (flash on GPU), and only the queries after it run FlexAttention,
  over a ``BlockMask`` (compiled ``create_block_mask`` on GPU). In a trajectory's trie that
  path is the sequential request, about 60% of the tokens and of the visible pairs. The causal
  part is as long as the shortest such path of the batch's rows (packed: the first row's). On
  FlexAttention's FLASH backend (FlashAttention 4, ``use_tree_attention(..., kernel_options=
  {"BACKEND": "FLASH"})``) every query runs on one ``BlockMask``: its kernel outruns flash's
  causal one on the tree.
* ``threadweaver_varlen``: a :class:`~threadweaver.hf_collator.segments.TriePlan`, the trie as
  two calls of flash attention's variable-length kernel (torch's own; CUDA, bf16 or fp16)
  merged by their log-sum-exps, at a cost that follows the visible pairs. Elsewhere a
  reference runs the same plan sequence by sequence.

``bench/tree_attention_gpu.py`` measures the GPU ones against plain causal attention.

The first layer builds the mask and keeps it on the :class:`DeferredMask` transformers hands every
layer of the forward as its ``attention_mask``: one mask a forward, compiled or not. Under
``torch.compile`` (the whole model, or each layer) ``threadweaver_flex`` runs the whole trie on one
``BlockMask``: no graph break for sdpa, eager or flex. ``threadweaver_varlen`` plans on the host and
breaks the graph.

Select one with ``from_pretrained(..., attn_implementation="threadweaver_sdpa")`` or
:func:`use_tree_attention` on a loaded model. Without ``subtree_end`` (generation) each
behaves exactly like its base implementation (``threadweaver_varlen``: sdpa). A model on
``flash_attention_*`` switches to ``threadweaver_varlen``: those kernels, given no tree, would
let sibling threads see each other.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from threadweaver.hf_collator.segments import TriePlan, trie_attention, trie_plan
from threadweaver.hosts import check_host

NAMES = {
    "sdpa": "threadweaver_sdpa",
    "eager": "threadweaver_eager",
    "flex_attention": "threadweaver_flex",
    "varlen": "threadweaver_varlen",
}
"""Base implementation -> the tree-masked implementation registered for it.

``varlen`` is flash attention's variable-length kernel, the base for any ``flash_attention_*``.
"""

FLASH_REFUSAL = (
    "the model runs {current!r}, which cannot see a ThreadWeaver trie: it only knows causal order (and "
    "packed sequences from position_ids), so sibling threads would silently attend to each other. Call "
    "use_tree_attention(model), which switches it to 'threadweaver_varlen' (the trie cut into causal "
    "segments for flash's variable-length kernel)"
)


KERNEL_OPTIONS = "threadweaver_flex_kernel_options"
"""The attribute of a model's attention modules that holds ``threadweaver_flex``'s FlexAttention kernel
options for trie forwards (see :func:`use_tree_attention`); options passed to the forward as
``kernel_options`` take precedence. On the modules, not the config: a setting of this run, it must not
be saved into checkpoints and come back with them."""


class TreeAttentionError(ValueError):
    """The model cannot run tree attention as configured."""


def tree_bool_mask(subtree_end: torch.Tensor) -> torch.Tensor:
    """[B, 1, N, N] bool, True where query ``q`` may attend to key ``kv``."""
    n = subtree_end.shape[-1]
    idx = torch.arange(n, device=subtree_end.device)
    causal = idx[None, :] <= idx[:, None]
    inside = idx[None, :, None] < subtree_end[:, None, :]
    return (causal & inside).unsqueeze(1)


def tree_additive_mask(subtree_end: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, N, N] float: 0 where attention is allowed, the dtype's minimum elsewhere."""
    allowed = tree_bool_mask(subtree_end)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=subtree_end.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def causal_head(subtree_end: torch.Tensor) -> int:
    """Length of the prefix over which the tree mask is causal in every row of the batch.

    In pre-order the first tokens of a row are the path from its root to its first leaf, so
    each of them sees every token before it; that path ends where the row's smallest
    ``subtree_end`` is (a padding token ends its own subtree, after the row).
    """
    return int(subtree_end.min())


def tree_block_mask(subtree_end: torch.Tensor, compile: bool | None = None, first_query: int = 0):
    """A FlexAttention ``BlockMask`` for the trie's queries from ``first_query`` on, over every key.

    Compiled on GPU, where it stays O(N) in memory.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if compile is None:
        compile = subtree_end.device.type == "cuda"
    compile = compile and not torch.compiler.is_compiling()  # inside a compiled model it is compiled with it

    def mask_mod(b, h, q, kv):
        return (kv <= q) & (q < subtree_end[b, kv])

    if first_query:
        # A tensor, not an int: a compiled mask function would be specialised to each value.
        offset = torch.tensor(first_query, dtype=subtree_end.dtype, device=subtree_end.device)
        whole_tree = mask_mod

        def mask_mod(b, h, q, kv):
            return whole_tree(b, h, q + offset, kv)

    batch, n = subtree_end.shape
    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(mask_mod, batch, None, n - first_query, n, device=subtree_end.device)


@dataclass(frozen=True)
class SplitTreeMask:
    """The trie mask for ``threadweaver_flex``: causal below ``head``, a ``BlockMask`` after it."""

    head: int
    """Queries ``[0, head)`` attend causally (:func:`causal_head`); 0 inside ``torch.compile``."""
    branches: Any
    """The ``BlockMask`` of queries ``[head, N)`` over keys ``[0, N)``; None where ``head == N``."""


def split_tree_mask(subtree_end: torch.Tensor, compile: bool | None = None, whole: bool = False) -> SplitTreeMask:
    """The split, or the whole trie on one ``BlockMask`` (``head == 0``) where ``whole`` or inside
    ``torch.compile``.

    The head's length is data: reading it inside a compiled model would break the graph in
    every layer, and an in-graph slice of the queries is misread by inductor's CPU FlexAttention
    (torch 2.13, silently wrong outputs).
    """
    head = 0 if whole or torch.compiler.is_compiling() else causal_head(subtree_end)
    rest = tree_block_mask(subtree_end, compile, first_query=head) if head < subtree_end.shape[-1] else None
    return SplitTreeMask(head, rest)


@functools.cache
def _compiled_create_block_mask():
    """Compiled once: without compilation ``create_block_mask`` materialises N x N intermediates."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


class DeferredMask:
    """What transformers hands every layer of one forward as its ``attention_mask``.

    For a plain forward it is the standard (padding-aware, N x N) mask, built only when a layer
    needs it, so a training batch never materialises one. For a trie forward it holds the tree
    mask the first layer builds, for the rest: one mask a forward, scoped to that forward, also
    inside ``torch.compile``.
    """

    def __init__(self, build: Callable[..., Any], kwargs: dict):
        self._build, self._kwargs = build, kwargs
        self._built, self._mask = False, None
        self._tree_masks: dict[tuple, Any] = {}

    def materialize(self):
        if not self._built:
            self._mask, self._built = self._build(**self._kwargs), True
        return self._mask

    def tree_mask(self, key: tuple, build: Callable[[], Any]):
        """The forward's tree mask for ``key`` (the layer's dtype and device), built on first use."""
        if key not in self._tree_masks:
            self._tree_masks[key] = build()
        return self._tree_masks[key]


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def flash_attention_4_missing() -> str | None:
    """Why FlexAttention's FLASH backend (FlashAttention 4) cannot run here, or None where it can."""
    if not _importable("torch._inductor.kernel.flex.flex_flash_attention"):
        return f"torch {torch.__version__} has no FLASH backend for FlexAttention"
    if not _importable("flash_attn.cute"):
        return "FlashAttention 4 is not installed (pip install flash-attn-4)"
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        major, minor = torch.cuda.get_device_capability()
        return (
            f"FlashAttention 4 needs a Hopper or Blackwell GPU, not {torch.cuda.get_device_name()} (sm_{major}{minor})"
        )
    return None


def _on_flash_backend(kernel_options: dict | None) -> bool:
    """FlashAttention 4 runs the whole trie: its kernel beats flash's causal one on the tree (3.2x at
    32k on an H200, bench/RESULTS.md), and it failed to build the split's offset query mask."""
    return bool(kernel_options) and kernel_options.get("BACKEND") == "FLASH"


@torch.compiler.disable
def _varlen_plan(subtree_end: torch.Tensor) -> TriePlan:
    """``threadweaver_varlen``'s plan, made on the host and never traced: its sizes are data, which
    a compiled model would break its graph on (and recompile for) at every step of the planning."""
    return trie_plan(subtree_end)


def _eager_base(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention (each modeling file defines ``eager_attention_forward``)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise TreeAttentionError(f"{type(module).__name__} defines no eager_attention_forward; use threadweaver_sdpa")
    return eager(module, query, key, value, attention_mask, **kwargs)


def _attention_dtype(query: torch.Tensor) -> torch.dtype:
    """Autocast's dtype where it is on for the query's device, else the query's own.

    Mixed precision (TRL's ``--bf16``) runs float32 weights under autocast, and Qwen3's query and key
    norms hand back float32 beside a bf16 value. ``sdpa`` casts its inputs itself, as FlexAttention does
    from torch 2.11 on; on older torch it would get the mix (FlashAttention 4 takes bf16 or fp16 only,
    Triton flex would run float32), and the varlen kernel is called directly.

    Only calls that torch.compile folds to constants: torch 2.11's Dynamo cannot trace
    ``torch.amp.is_autocast_available``, and a break there recompiled every layer past its limit."""
    device = query.device.type
    if device != "meta" and torch.is_autocast_enabled(device):  # the meta device has no autocast
        return torch.get_autocast_dtype(device)
    return query.dtype


def _refuse_unsupported(name: str, kwargs: dict) -> None:
    """What the tree's own kernel calls do not take: score softcapping, attention sinks, a position bias
    and attention dropout."""
    for unsupported in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise TreeAttentionError(f"{name}: {unsupported} is not supported with a trie")
    if (kwargs.get("dropout") or 0.0) > 0:
        raise TreeAttentionError(f"{name}: attention dropout is not supported")


def _flex_attention(module, query, key, value, block_mask, scaling=None, kernel_options=None, **kwargs):
    """FlexAttention over the tree's ``BlockMask``, [B, N, heads, dim] out, without the log-sum-exp that
    transformers' ``flex_attention_forward`` returns on GPU: FlashAttention 4's backward cannot
    differentiate through one, so training on its FLASH backend failed to compile."""
    from transformers.integrations.flex_attention import compile_friendly_flex_attention

    _refuse_unsupported("threadweaver_flex", kwargs)
    if query.device.type == "cpu" and query.requires_grad:
        raise TreeAttentionError(
            "threadweaver_flex: FlexAttention has no backward on CPU: train there with "
            "use_tree_attention(model, 'sdpa'), the same tree as a dense mask (flex runs forwards under no_grad)"
        )
    dtype = _attention_dtype(query)
    out = compile_friendly_flex_attention(
        query.to(dtype),
        key.to(dtype),
        value.to(dtype),
        block_mask=block_mask,
        enable_gqa=query.shape[1] != key.shape[1],
        scale=scaling,
        kernel_options=kernel_options,
        training=module.training,
    )
    return out.transpose(1, 2).contiguous()


def _split_flex_attention(module, query, key, value, mask: SplitTreeMask, kernel_options=None, **kwargs):
    """Causal ``sdpa`` over the head's queries, FlexAttention over the rest; one output."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    head = mask.head
    parts = []
    if head:
        causal = {**kwargs, "is_causal": True}
        parts.append(
            sdpa_attention_forward(module, query[:, :, :head], key[:, :, :head], value[:, :, :head], None, **causal)[0]
        )
    if mask.branches is not None:
        parts.append(
            _flex_attention(
                module, query[:, :, head:], key, value, mask.branches, kernel_options=kernel_options, **kwargs
            )
        )
    return (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]), None


def _trie_varlen_attention(module, query, key, value, plan: TriePlan, **kwargs):
    """The [B, heads, N, dim] tensors flattened to tokens for the varlen calls."""
    _refuse_unsupported("threadweaver_varlen", kwargs)
    batch, heads, n, dim = query.shape
    dtype = _attention_dtype(query)
    if query.device.type == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        raise TreeAttentionError(f"threadweaver_varlen: flash attention runs in bf16 or fp16, not {dtype}")

    def tokens(x):
        return x.transpose(1, 2).reshape(batch * n, x.shape[1], dim).to(dtype)

    scale = kwargs.get("scaling") or dim**-0.5
    out = trie_attention(tokens(query), tokens(key), tokens(value), plan, scale)
    return out.view(batch, n, heads, dim), None


def _bases() -> dict[str, tuple[Callable, Callable, Callable, Callable]]:
    """Per base name: (attention function, standard mask function, tree mask builder, attention over that mask).

    A builder takes (``subtree_end``, the layer's dtype, FlexAttention's kernel options)."""
    from transformers.integrations.flex_attention import flex_attention_forward
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import eager_mask, flex_attention_mask, sdpa_mask

    return {
        "sdpa": (
            sdpa_attention_forward,
            sdpa_mask,
            lambda end, dtype, options: tree_bool_mask(end),
            sdpa_attention_forward,
        ),
        "eager": (_eager_base, eager_mask, lambda end, dtype, options: tree_additive_mask(end, dtype), _eager_base),
        "flex_attention": (
            flex_attention_forward,
            flex_attention_mask,
            lambda end, dtype, options: split_tree_mask(end, whole=_on_flash_backend(options)),
            _split_flex_attention,
        ),
        "varlen": (
            sdpa_attention_forward,
            sdpa_mask,
            lambda end, dtype, options: _varlen_plan(end),
            _trie_varlen_attention,
        ),
    }


def _tree_attention(name: str, attention: Callable, build_tree_mask: Callable, tree_attend: Callable) -> Callable:
    flex = name == NAMES["flex_attention"]

    def tree_attention(module, query, key, value, attention_mask, subtree_end=None, **kwargs):
        if subtree_end is None:
            if isinstance(attention_mask, DeferredMask):
                attention_mask = attention_mask.materialize()
            return attention(module, query, key, value, attention_mask, **kwargs)
        n = subtree_end.shape[-1]
        if query.shape[-2] != n or key.shape[-2] != n:
            raise TreeAttentionError(
                f"{name}: a trie forward runs over the whole flattened batch without a KV cache "
                f"(queries {query.shape[-2]}, keys {key.shape[-2]}, subtree_end {n})"
            )
        if kwargs.get("sliding_window") is not None:
            raise TreeAttentionError(f"{name}: sliding-window layers are not supported with a trie")
        if flex and kwargs.get("kernel_options") is None:
            kwargs["kernel_options"] = getattr(module, KERNEL_OPTIONS, None)

        def build():
            return build_tree_mask(subtree_end.to(query.device), query.dtype, kwargs.get("kernel_options"))

        if isinstance(attention_mask, DeferredMask):
            mask = attention_mask.tree_mask((query.dtype, query.device), build)
        else:  # a model that makes its masks without transformers' mask interface: each layer builds one
            mask = build()
        return tree_attend(module, query, key, value, mask, **kwargs)

    tree_attention.__name__ = name
    return tree_attention


def _deferred(build: Callable) -> Callable:
    def deferred_mask(**kwargs):
        return DeferredMask(build, kwargs)

    return deferred_mask


def register() -> None:
    """Register the ``threadweaver_*`` implementations with transformers (idempotent)."""
    check_host("transformers")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for base, (attention, standard_mask, build_tree_mask, tree_attend) in _bases().items():
        name = NAMES[base]
        AttentionInterface.register(name, _tree_attention(name, attention, build_tree_mask, tree_attend))
        AttentionMaskInterface.register(name, _deferred(standard_mask))


def use_tree_attention(model, backend: str | None = None, kernel_options: dict | None = None):
    """Switch ``model`` to tree attention in place and return it.

    ``backend`` is ``"sdpa"``, ``"eager"``, ``"flex_attention"`` or ``"varlen"``; by default the
    model's current implementation, where ``flash_attention_*`` means ``"varlen"``.
    ``kernel_options`` are FlexAttention's for ``"flex_attention"``, kept on the model's attention
    modules (:data:`KERNEL_OPTIONS`) so that every trie forward uses them. None keeps those the model
    has (another backend drops them), ``{}`` drops them; ``{"BACKEND": "FLASH"}`` runs FlashAttention
    4 (``flash-attn-4``, Hopper or Blackwell) over the whole trie.
    """
    current = model.config._attn_implementation
    config = model.config.get_text_config()
    if backend is None:
        backend = next((base for base, name in NAMES.items() if name == current), current)
    if backend.startswith("flash"):
        backend = "varlen"
    if backend not in NAMES:
        raise TreeAttentionError(f"no tree attention for {backend!r}; choose one of {sorted(NAMES)}")
    if kernel_options and backend != "flex_attention":
        raise TreeAttentionError(f"kernel_options are FlexAttention's: use backend 'flex_attention', not {backend!r}")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise TreeAttentionError(f"tree attention needs full-attention layers only, not {sorted(layer_types)}")
    if current != NAMES[backend]:
        model.set_attn_implementation(NAMES[backend])
    if kernel_options is not None or backend != "flex_attention":
        for module in model.modules():
            if getattr(module, "config", None) is config:  # the attention modules among them
                setattr(module, KERNEL_OPTIONS, dict(kernel_options) if kernel_options else None)
    return model


def check_tree_attention(model) -> None:
    """Raise unless ``model`` runs a ``threadweaver_*`` implementation (before training on tries)."""
    current = model.config._attn_implementation
    if current in NAMES.values():
        return
    if current.startswith("flash"):
        raise TreeAttentionError(FLASH_REFUSAL.format(current=current))
    raise TreeAttentionError(
        f"the model runs {current!r}, which ignores the trie and trains siblings on each other; "
        "load it with attn_implementation='threadweaver_sdpa' (or call use_tree_attention(model))"
    )
