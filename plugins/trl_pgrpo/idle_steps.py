"""Skip the optimizer step of a P-GRPO step that has nothing to learn.

When every group of a step earns one reward (all its rollouts wrong, or all right and equally
fast), every advantage is 0 and, with ``beta=0``, so is every gradient. torch's AdamW still
moves the weights on such a step: the gradient only decays its moments, and their
bias-corrected ratio repeats the earlier updates (at 0.67, 0.52, ... of step 1's size, for
TRL's betas), and weight decay shrinks every weight. Measured on SmolLM2-135M in
``bench/pretrained.py`` (third run, ``bench/RESULTS.md``): after one step with a signal and
seven without, greedy accuracy fell from 76% to 1%.

torch's optimizers pass over a parameter whose ``grad`` is None, moments and step count
included, so dropping every gradient of such a step leaves the weights exactly where they were.
This applies where the optimizer reads ``param.grad`` (one process, DDP); DeepSpeed and FSDP
keep their gradients elsewhere and step as before.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

SKIPPED_METRIC = "threadweaver/optimizer_step_skipped"
"""1 for a step whose gradient was exactly zero and so moved nothing, else 0."""


def gradient_is_zero(model: torch.nn.Module) -> bool:
    """Whether every gradient of ``model`` is absent or exactly zero (max-norm: no underflow)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    return not bool(torch.stack(torch._foreach_norm(grads, float("inf"))).any())


class SkipIdleSteps(TrainerCallback):
    """Drops the gradients of a step whose gradient is exactly zero, so the optimizer leaves it alone.

    ``metrics`` is the trainer's list of this step's values per name, where the step is counted
    under :data:`SKIPPED_METRIC`.
    """

    def __init__(self, metrics: dict[str, list]):
        self.metrics = metrics

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        skipped = gradient_is_zero(model)
        if skipped:
            model.zero_grad(set_to_none=True)
        self.metrics[SKIPPED_METRIC].append(float(skipped))
