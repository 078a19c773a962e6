#!/usr/bin/env bash
# FlashAttention 4 (FlexAttention's FLASH backend) for a GPU machine that has no network.
#
#   bench/gpu_wheels.sh [OUT_DIR]        # default .gpu_wheels (git-ignored)
#
# Downloads the wheels that bench/tree_attention_gpu.py's FA4 arms need, for the device image
# (Python 3.12, x86-64, torch 2.11 + CUDA 13: the versions below are the ones released with
# torch 2.11, whose inductor writes the CuTe DSL code that calls them), and cuts them into
# parts small enough to travel beside the working tree (about 17 MiB) under the 64 MiB a device
# call carries: one part a call. bench/tree_attention_gpu_device.sh puts them back together
# and installs them there. The device image already has cuda-bindings, einops and numpy.
# Beside them, whole in OUT_DIR/sft: what `threadweaver sft` (bench/sft_gpu.py) needs that the image
# lacks, TRL and the datasets library at the versions tested here (the image has accelerate,
# pandas, pyarrow, xxhash and fsspec).
# CUDA=12 takes CuTe DSL's CUDA 12 build instead of its CUDA 13 one (the two are the same size,
# and a CUDA 13 driver runs either).
set -euo pipefail

OUT=${1:-.gpu_wheels}
PART_MIB=${PART_MIB:-40}
case ${CUDA:-13} in
  13) CUTE_LIBS=nvidia-cutlass-dsl-libs-cu13==4.4.2 ;;
  12) CUTE_LIBS=nvidia-cutlass-dsl-libs-base==4.4.2 ;;
  *) echo "gpu_wheels: CUDA is 12 or 13, not ${CUDA}" >&2; exit 2 ;;
esac
WHEELS=(
  flash-attn-4==4.0.0b7
  nvidia-cutlass-dsl==4.4.2
  "$CUTE_LIBS"
  quack-kernels==0.3.7
  apache-tvm-ffi==0.1.9
  torch-c-dlpack-ext==0.1.5
)

SFT_WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

download=$(mktemp -d)
sft=$(mktemp -d)
trap 'rm -rf "$download" "$sft"' EXIT
fetch() {  # DIR WHEEL...: the wheels for the device, exactly one a name
  local dir=$1
  shift
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --dest "$dir" "$@"
  local count
  count=$(find "$dir" -name '*.whl' | wc -l)
  if [ "$count" -ne $# ]; then
    echo "gpu_wheels: expected $# wheels, downloaded $count into $dir" >&2
    exit 1
  fi
}
fetch "$download" "${WHEELS[@]}"
fetch "$sft" "${SFT_WHEELS[@]}"
count=${#WHEELS[@]}

mkdir -p "$OUT"  # replaced only once every wheel is here
rm -rf "$OUT"/part-* "$OUT"/SHA256SUMS "$OUT"/sft
cp -r "$sft" "$OUT/sft" && chmod 755 "$OUT/sft"
tar -C "$download" -cf - . | split --bytes="${PART_MIB}M" - "$OUT/part-"
(cd "$OUT" && sha256sum part-* >SHA256SUMS)
echo "gpu_wheels: $count wheels in $(ls "$OUT"/part-* | wc -l) parts of at most $PART_MIB MiB under $OUT:"
ls -l "$OUT" "$OUT/sft"
