#!/usr/bin/env bash
# P-GRPO with ThreadWeaver rollouts on one node with verl 0.9.1 (v1 trainer), unmodified.
#
#   MODEL=/path/to/sft-model ./examples/verl/run_pgrpo.sh [more hydra overrides]
#   MODEL=... CONFIG=threadweaver_sequential ./examples/verl/run_pgrpo.sh   # the sequential baseline
#
# Needs: pip install ".[verl]" "verl[vllm]==0.9.1" (GPU) in the checkout, in a venv of its own (verl pins
# transformers<5.11; examples/ is not in the wheel). MODEL is an SFT'd ThreadWeaver model
# (`threadweaver sft`), or for the baseline a sequential one (`threadweaver sft --no-branching`:
# a ThreadWeaver model decoded without branching writes its tags as text); DATA holds train.parquet and test.parquet (made from the synthetic task
# when it has neither; pass --problems FILE.jsonl to threadweaver.verl_rollout.data for your own).
# NGPUS: GPUs on this node (default: those `nvidia-smi -L` lists).
set -euo pipefail
MODEL=${MODEL:?set MODEL to the SFT model directory or hub id}
DATA=${DATA:-$HOME/data/threadweaver_synth}
CONFIG=${CONFIG:-threadweaver_pgrpo}
if [ -z "${NGPUS:-}" ]; then
  # grep -c fails on no match: nvidia-smi missing, failing, or listing no GPU all end here.
  NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || {
    echo "run_pgrpo.sh: cannot count GPUs (nvidia-smi -L lists none, or there is no nvidia-smi); set NGPUS" >&2
    exit 1
  }
fi
[[ $NGPUS =~ ^[0-9]+$ ]] && (( 10#$NGPUS > 0 )) || {
  echo "run_pgrpo.sh: NGPUS must be a whole number above 0, not '$NGPUS'" >&2
  exit 1
}
NGPUS=$(( 10#$NGPUS ))
if [ -f "$MODEL" ]; then
  echo "run_pgrpo.sh: MODEL $MODEL: a file, not a model directory (the folder that holds config.json)" >&2
  exit 1
fi
# a hub id (org/name) or a remote path (hdfs://...) is verl's to fetch; a local path that is no folder here is a
# slip: /a, ./a, ~/a, a/b/c, or runs/m where runs/ is a folder here (threadweaver's hub-id rule, kit.tokenizers.hub_id)
if [[ $MODEL != *://* ]] && [ ! -d "$MODEL" ] && {
  [[ $MODEL == /* || $MODEL == .* || $MODEL == "~"* || $MODEL == */*/* ]] || { [[ $MODEL == */* ]] && [ -d "${MODEL%%/*}" ]; }
}; then
  echo "run_pgrpo.sh: MODEL $MODEL: no such directory" >&2
  exit 1
fi
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('verl') is None)" || {
  echo "run_pgrpo.sh: $(command -v python) has no verl: run this in the environment where verl and threadweaver[verl] are installed" >&2
  exit 1
}
if [ -e "$DATA/train.parquet" ] && [ ! -e "$DATA/test.parquet" ] || { [ ! -e "$DATA/train.parquet" ] && [ -e "$DATA/test.parquet" ]; }; then
  echo "run_pgrpo.sh: $DATA has only one of train.parquet and test.parquet; add the other, or set DATA to another folder" >&2
  exit 1
fi
printing_config=
for arg in "$@"; do [[ $arg == --cfg || $arg == --cfg=* || $arg == -c ]] && printing_config=1; done
if [ -z "$printing_config" ]; then  # hydra's --cfg (-c) prints the config and trains nothing
  # Ray waits without end for GPUs a node does not have: count the ones torch sees first.
  seen=$(python -c "import torch; print(torch.cuda.device_count())") || {
    echo "run_pgrpo.sh: $(command -v python) cannot import torch to count the GPUs" >&2
    exit 1
  }
  (( seen >= NGPUS )) || {
    echo "run_pgrpo.sh: NGPUS is $NGPUS but torch sees $seen CUDA device(s) here (verl's Ray start would wait for the rest without end)" >&2
    exit 1
  }
fi

[ -e "$DATA/train.parquet" ] || python -m threadweaver.verl_rollout.data "$DATA"
exec python -m verl.trainer.main_ppo \
  --config-path="$(python -m threadweaver.verl_rollout.config)" --config-name="$CONFIG" \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  trainer.n_gpus_per_node="$NGPUS" trainer.nnodes=1 \
  "$@"
