"""Run by test_pgrpo_trl_vllm.py in its own process: a PGRPOTrainer on TRL's colocated vLLM.

vLLM in-process sets up torch.distributed and caps torch's threads, so it gets a process
of its own; this script writes what it measured as JSON for the test to check.
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from pgrpo_helpers import GROUP, Recorder, trainer_for  # noqa: E402

from threadweaver.quickstart.recipe import embedded_models  # noqa: E402

PROBE = list(range(5, 40))
"""A fixed context whose next-token log-probs compare vLLM's weights with the policy's."""


def vllm_logprobs(trainer, context):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    [output] = trainer.vllm_generation.llm.generate([{"prompt_token_ids": context}], params, use_tqdm=False)
    return [next(iter(step.values())).logprob for step in output.prompt_logprobs[1:]]


def policy_logprobs(trainer, context):
    with torch.no_grad():
        scores = torch.log_softmax(trainer.model(torch.tensor([context])).logits[0].float(), -1)
    return [scores[i - 1, context[i]].item() for i in range(1, len(context))]


def main(out_path: str, work: str) -> None:
    trainer = trainer_for(work, use_vllm=True, vllm_mode="colocate", max_steps=2)
    recorder = Recorder(trainer)
    trainer.train()
    steps = []
    for _inputs, trajectories, out in recorder.steps:
        trained = (out["tool_mask"] * out["completion_mask"]).bool()
        steps.append(
            {
                "blocks": [t.stats.blocks for t in trajectories],
                "total_tokens": [t.stats.total_tokens for t in trajectories],
                "trained_tokens": int(trained.sum()),
                "sampling": out["sampling_per_token_logps"][trained].tolist(),
                "trainer": out["old_per_token_logps"][trained].tolist(),
                "engine_calls": sum(len(t.calls) for t in trajectories),
                "requests": sum(len(t.requests) for t in trajectories),
            }
        )
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    synced = {"vllm": vllm_logprobs(trainer, PROBE), "policy": policy_logprobs(trainer, PROBE)}
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in trainer.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    stale = vllm_logprobs(trainer, PROBE)
    trainer.vllm_generation.sync_weights()
    perturbed = {"stale": stale, "vllm": vllm_logprobs(trainer, PROBE), "policy": policy_logprobs(trainer, PROBE)}
    with open(out_path, "w") as f:
        json.dump(
            {
                "group": GROUP,
                "steps": steps,
                "logs": logs,
                "synced": synced,
                "perturbed": perturbed,
                "model": str(embedded_models()["parallel"]),
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
