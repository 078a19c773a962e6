"""Run by test_pgrpo_trl.py under ``torchrun --nproc_per_node 2``: one PGRPOTrainer step on two
CPU processes (gloo); each rank writes its own rollouts' stats and the logs it kept."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pgrpo_helpers import Recorder, trainer_for  # noqa: E402


def main(out: str) -> None:
    trainer = trainer_for(out, max_steps=1)
    recorder = Recorder(trainer)
    trainer.train()
    trajectories = [t for _, batch, _ in recorder.steps for t in batch]
    with open(os.path.join(out, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(
            {
                "processes": trainer.accelerator.num_processes,
                "total_tokens": [t.stats.total_tokens for t in trajectories],
                "critical_path_tokens": [t.stats.critical_path_tokens for t in trajectories],
                "stopped": [t.finish_reason == "stop" for t in trajectories],
                "logs": [entry for entry in trainer.state.log_history if "loss" in entry],
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1])
