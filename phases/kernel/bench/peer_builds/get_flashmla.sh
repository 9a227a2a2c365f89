#!/usr/bin/env bash
# On a machine with PyPI access, from the project root: put the sgl-flash-mla 1.0.0 wheel (FlashMLA
# with its sm90 dense bf16 kernels prebuilt, ~10 MB; abi3, so any CPython >= 3.10) into BUILD
# (default .peers/build, ignored by git and carried to the GPU host), so nothing compiles there.
#   bash phases/kernel/bench/peer_builds/get_flashmla.sh [BUILD]
set -euo pipefail
BUILD="${1:-.peers/build}"
WHEEL=sgl_flash_mla-1.0.0-cp310-abi3-manylinux2014_x86_64.whl
SHA256=95d2761376337af4568dbadedc1807b0d90e4d8383c63fa859518a34937392b3
mkdir -p "$BUILD"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$BUILD" "sgl-flash-mla==1.0.0"
echo "$SHA256  $BUILD/$WHEEL" | sha256sum -c --quiet
ls -la "$BUILD/$WHEEL"
