#!/usr/bin/env bash
# P-GRPO with ThreadWeaver rollouts on one node with verl 0.9.1 (v1 trainer), unmodified.
#
#   MODEL=/path/to/sft-model ./examples/verl/run_pgrpo.sh [more hydra overrides]
#   MODEL=... CONFIG=threadweaver_sequential ./examples/verl/run_pgrpo.sh   # the sequential baseline
#
# Needs: pip install "threadweaver[verl]" vllm (GPU). MODEL is an SFT'd ThreadWeaver model
# (`threadweaver sft`); DATA holds train.parquet/test.parquet (made from the synthetic task
# when missing; pass --problems FILE.jsonl to threadweaver.verl_rollout.data for your own).
set -euo pipefail
MODEL=${MODEL:?set MODEL to the SFT model directory or hub id}
DATA=${DATA:-$HOME/data/threadweaver_synth}
CONFIG=${CONFIG:-threadweaver_pgrpo}
NGPUS=${NGPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}

[ -f "$DATA/train.parquet" ] || python -m threadweaver.verl_rollout.data "$DATA"
exec python -m verl.trainer.main_ppo \
  --config-path="$(python -m threadweaver.verl_rollout.config)" --config-name="$CONFIG" \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  trainer.n_gpus_per_node="${NGPUS:-1}" trainer.nnodes=1 \
  "$@"
