#!/usr/bin/env bash
# bench/tree_attention_gpu.py and bench/sft_gpu.py in calls of a GPU machine that has no network and no
# threadweaver install.
#
#   bench/tree_attention_gpu_device.sh stash             # keep the wheel parts this call carried, and stop
#   bench/tree_attention_gpu_device.sh sft [SFT_ARGS...] # bench/sft_gpu.py: the real `threadweaver sft`
#   bench/tree_attention_gpu_device.sh [BENCH_ARGS...]   # bench/tree_attention_gpu.py
#
# bench/gpu_wheels.sh downloads what the device image lacks. FlashAttention 4's wheels are larger than
# one call carries, so they travel one part a call: each call keeps the parts it carried in
# /tmp/gpu_wheels, which lasts as long as the machine stays warm. Once every part listed in SHA256SUMS
# is there and checks out, they are installed into /tmp/site; otherwise the FA4 arms say why they did
# not run. TRL and the datasets library (.gpu_wheels/sft, a few MB) travel whole, with each call that
# runs `threadweaver sft`. The package runs from a copy laid out as the installed one (plugins/<name>
# and apps/<name> -> threadweaver.<name>). $PYTHON (python3) runs it; the results and the logs go to
# $OUT (the device's folder that comes back), or runs/ elsewhere. With no arguments, the runs issue 40
# waits for (below), after a first call that carried the other part: 5 to 8 minutes on an H200.
# Every run ends by $CALL_S seconds (default 540) after the script starts, inside the device's
# 600 s a call: a run still going then is interrupted, and keeps the results it saved.
set -uo pipefail

KEEP=/tmp/gpu_wheels
OUT=${OUT:-runs}
PYTHON=${PYTHON:-python3}
DEADLINE=$((SECONDS + ${CALL_S:-540}))
MODE=${1:-}
mkdir -p "$KEEP" "$OUT"
for carried in .gpu_wheels/part-* .gpu_wheels/SHA256SUMS; do
  [ -f "$carried" ] && cp "$carried" "$KEEP"/
done
echo "wheel parts kept: $(cd "$KEEP" && ls part-* 2>/dev/null | tr '\n' ' ')"
if [ "$MODE" = stash ]; then
  nvidia-smi -L
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
  exit 0
fi

rm -rf /tmp/wheels && mkdir -p /tmp/wheels
if compgen -G ".gpu_wheels/sft/*.whl" >/dev/null; then
  cp .gpu_wheels/sft/*.whl /tmp/wheels/
elif [ "$MODE" = sft ] || [ -z "$MODE" ]; then
  echo "TRL's wheels (.gpu_wheels/sft) were not carried: \`threadweaver sft\` runs only where the image has TRL"
fi
if [ -f "$KEEP/SHA256SUMS" ] && (cd "$KEEP" && sha256sum --check --quiet SHA256SUMS); then
  (cd "$KEEP" && cat $(awk '{print $2}' SHA256SUMS)) | tar -xf - -C /tmp/wheels  # the listed parts, in order
else
  echo "FlashAttention 4's wheel parts are not all here: the FA4 arms will say so"
fi
if compgen -G "/tmp/wheels/*.whl" >/dev/null; then
  if "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site /tmp/wheels/*.whl; then
    # PYTHONPATH is no site directory: the folders its .pth files name (cutlass's) join it by hand.
    site_path=/tmp/site
    for pth in /tmp/site/*.pth; do
      [ -f "$pth" ] || continue
      while IFS= read -r line || [ -n "$line" ]; do
        case $line in import* | "#"* | "") ;; *) site_path=$site_path:/tmp/site/$line ;; esac
      done <"$pth"
    done
    export PYTHONPATH=$site_path${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "the carried wheels did not install: the arms that need them will say so"
  fi
fi

rm -rf /tmp/pkg && mkdir -p /tmp/pkg
cp -r threadweaver /tmp/pkg/
for layer in plugins/*/ apps/*/; do cp -r "$layer" /tmp/pkg/threadweaver/; done
export PYTHONPATH=/tmp/pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
"$PYTHON" - <<'VERSIONS'
import sys
from importlib import metadata
names = "torch transformers accelerate trl datasets pyarrow pandas fsspec huggingface_hub flash-attn-4".split()
found = {}
for name in names:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = "missing"
print("python", sys.version.split()[0], found)
VERSIONS

bench() {  # SCRIPT NAME ARGS...: bench/SCRIPT.py, its JSON and log under $OUT/NAME.*, until the deadline
  local script=$1 name=$2 left=$((DEADLINE - SECONDS))
  shift 2
  if [ "$left" -lt 30 ]; then
    echo "$name: not started, $left s before the call's deadline" | tee "$OUT/$name.log"
    return 1
  fi
  timeout --signal=INT --kill-after=15 "$left" "$PYTHON" "bench/$script.py" --out "$OUT/$name.json" "$@" 2>&1 |
    tee "$OUT/$name.log"
}
case "$MODE" in
  sft) shift; bench sft_gpu sft_gpu "$@"; exit ;;
  ?*) bench tree_attention_gpu tree_attention_gpu "$@"; exit ;;
esac
# The defaults, for the call after a first one that carried the other wheel part (`sft` measured FA4 on
# 2026-11-28: it trains to the dense mask's losses; bench/RESULTS.md):
# 1. causal and threadweaver_flex on FA4 through use_tree_attention, uncompiled and compiled: the
#    issue's own 4k row (threads of 100 tokens, bf16 weights as the issue's table);
# 2. threads of 1,000 tokens at 4k and 32k as `threadweaver sft` trains (float32 weights under bf16
#    autocast); the compiled 32k recompiles with dynamic shapes.
# A failed run does not stop the next.
GOAL=(--kernel-sizes --sweep-size 0 --profile-size 0 --packed-size 0 --dense-max 0 --arms causal
  "threadweaver_flex FA4")
status=0
bench tree_attention_gpu tree_attention_gpu_threads100 "${GOAL[@]}" --thread-tokens 100 --sizes 4096 \
  --compile-sizes 4096 --budget-s 120 || status=$?
bench tree_attention_gpu tree_attention_gpu_threads1000 "${GOAL[@]}" --mixed-precision --thread-tokens 1000 \
  --sizes 4096 32768 --compile-sizes 4096 32768 --budget-s 300 || status=$?
exit $status
