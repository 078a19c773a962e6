#!/usr/bin/env bash
# bench/tree_attention_gpu.py in one call of a GPU machine that has no network and no threadweaver install.
#
#   bench/tree_attention_gpu_device.sh stash             # keep the wheel parts this call carried, and stop
#   bench/tree_attention_gpu_device.sh [BENCH_ARGS...]   # the bench, on FA4 too where every part is here
#
# FlashAttention 4's wheels (bench/gpu_wheels.sh) are larger than one call carries, so they
# travel one part a call: each call keeps the parts it carried in /tmp/gpu_wheels, which lasts
# as long as the machine stays warm. Once every part listed in SHA256SUMS is there and checks
# out, they are installed into /tmp/site; otherwise the bench runs without them and its FA4
# arms say why. The package runs from a copy laid out as the installed one (plugins/<name> ->
# threadweaver.<name>). $PYTHON (python3) runs it; the results and the log go to $OUT (the
# device's folder that comes back), or runs/ elsewhere. With no BENCH_ARGS, the runs issue 40
# waits for, at the sizes of its goal (below); about 6 minutes on an H200.
set -uo pipefail

KEEP=/tmp/gpu_wheels
OUT=${OUT:-runs}
PYTHON=${PYTHON:-python3}
mkdir -p "$KEEP" "$OUT"
for carried in .gpu_wheels/part-* .gpu_wheels/SHA256SUMS; do
  [ -f "$carried" ] && cp "$carried" "$KEEP"/
done
echo "wheel parts kept: $(cd "$KEEP" && ls part-* 2>/dev/null | tr '\n' ' ')"
if [ "${1:-}" = stash ]; then
  nvidia-smi -L
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
  exit 0
fi

if [ -f "$KEEP/SHA256SUMS" ] && (cd "$KEEP" && sha256sum --check --quiet SHA256SUMS); then
  rm -rf /tmp/wheels && mkdir -p /tmp/wheels
  (cd "$KEEP" && cat $(awk '{print $2}' SHA256SUMS)) | tar -xf - -C /tmp/wheels  # the listed parts, in order
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
    echo "FlashAttention 4's wheels did not install: the FA4 arms will say so"
  fi
else
  echo "FlashAttention 4's wheel parts are not all here: the FA4 arms will say so"
fi

rm -rf /tmp/pkg && mkdir -p /tmp/pkg
cp -r threadweaver /tmp/pkg/
for plugin in plugins/*/; do cp -r "$plugin" /tmp/pkg/threadweaver/; done
export PYTHONPATH=/tmp/pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

bench() {  # NAME BENCH_ARGS...: the JSON and the log under $OUT/NAME.*
  local name=$1
  shift
  "$PYTHON" bench/tree_attention_gpu.py --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
}
if [ $# -gt 0 ]; then
  bench tree_attention_gpu "$@"
  exit
fi
# Causal and threadweaver_flex on FA4 through use_tree_attention (Triton flex, varlen and the kernels were
# measured on 2026-11-27, bench/RESULTS.md), uncompiled and compiled: the issue's own 4k row first
# (threads of 100 tokens, Triton flex too), then threads of 1,000 tokens at 4k and 32k. A failed run
# does not stop the next.
GOAL=(--kernel-sizes --sweep-size 0 --profile-size 0 --packed-size 0 --dense-max 0 --arms causal
  "threadweaver_flex FA4")
status=0
bench tree_attention_gpu_threads100 "${GOAL[@]}" threadweaver_flex --thread-tokens 100 --sizes 4096 \
  --compile-sizes 4096 --budget-s 170 || status=$?
bench tree_attention_gpu_threads1000 "${GOAL[@]}" --thread-tokens 1000 --sizes 4096 32768 \
  --compile-sizes 4096 32768 --budget-s 270 || status=$?
exit $status
