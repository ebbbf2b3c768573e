#!/usr/bin/env bash
# FlashInfer's chain speculative sampling kernel as a shared library, for bench's flashinfer contender where the
# flashinfer package cannot be imported (bench/flashinfer_peer.py). Needs pip (network) and nvcc; the result runs
# on any machine with a CUDA driver of that nvcc's version or newer (the CUDA runtime is linked in statically).
# Usage: scripts/build_flashinfer_chain.sh [OUT_DIR] [ARCH]   (defaults: .fi sm_90), then
#        SPECDEC_FLASHINFER_LIB=OUT_DIR/libflashinfer_chain.so specdec bench --modes exact,flashinfer --device cuda
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.fi} ARCH=${2:-sm_90}
FLASHINFER=${FLASHINFER:-flashinfer-python==0.7.2.post1} CURAND=${CURAND:-nvidia-curand==10.4.5.25}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# sampling.cuh and the headers beside it come from FlashInfer's wheel; curand's headers from NVIDIA's
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 -d "$work" "$FLASHINFER" "$CURAND"
(cd "$work" && for w in *.whl; do python3 -m zipfile -e "$w" unpacked; done)
include=$work/unpacked/flashinfer/data/include
curand=$(dirname "$(find "$work/unpacked" -name curand.h | head -1)")
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -gencode "arch=compute_${ARCH#sm_},code=$ARCH" -Xcompiler -fPIC -shared \
    -I "$include" -I "$curand" -o "$OUT/libflashinfer_chain.so" scripts/flashinfer_chain.cu
echo "built $OUT/libflashinfer_chain.so ($FLASHINFER, $ARCH)"
