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
Processes decide together (the largest gradient anywhere), so sharded gradients (FSDP) skip or
step on every rank alike. Where the optimizer keeps the gradients itself (DeepSpeed), no
``param.grad`` is set, and the step is left to it and not counted.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

SKIPPED_METRIC = "threadweaver/optimizer_step_skipped"
"""1 for a step whose gradient was exactly zero and so moved nothing, else 0."""


def zero_gradient(model: torch.nn.Module) -> bool | None:
    """Whether every process's gradient is exactly zero; None where no process has a ``param.grad``.

    The max-norm of each gradient (its local shard, for a sharded one) cannot underflow as a
    2-norm can.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    device = next(model.parameters()).device
    norms = [norm.float().to(device) for norm in torch._foreach_norm(grads, float("inf"))]
    largest = torch.stack(norms).max() if norms else torch.tensor(0.0, device=device)
    found = torch.stack([largest, torch.tensor(float(bool(grads)), device=device)])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
    largest, any_grads = found.tolist()
    return largest == 0.0 if any_grads else None


class SkipIdleSteps(TrainerCallback):
    """Drops the gradients of a step whose gradient is exactly zero, so the optimizer leaves it alone.

    ``metrics`` is the trainer's list of this step's values per name, where the step is counted
    under :data:`SKIPPED_METRIC`.
    """

    def __init__(self, metrics: dict[str, list]):
        self.metrics = metrics

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        skipped = zero_gradient(model)
        if skipped is None:
            return
        if skipped:
            model.zero_grad(set_to_none=True)
        self.metrics[SKIPPED_METRIC].append(float(skipped))
