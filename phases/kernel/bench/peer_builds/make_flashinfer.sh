#!/usr/bin/env bash
# On a CPU machine with PyPI access and CUDA 13.0's nvcc (no GPU needed; about 5 minutes on 2 cores),
# from the project root: a FlashInfer whose MLA modules come compiled, into BUILD (default
# .peers/build, ignored by git, ~15 MB, carried to the GPU host):
#   BUILD/apache_tvm_ffi-0.1.15.post2-cp312-*.whl   (flashinfer's one compiled dependency)
#   BUILD/flashinfer_pkg.tar.xz                       (trimmed flashinfer-python 0.7.2.post1)
#   BUILD/SHA256SUMS
#     bash phases/kernel/bench/peer_builds/make_flashinfer.sh [BUILD]
# The package index offers no flashinfer with its sm_90 MLA modules compiled (flashinfer-python
# JIT-compiles them on first use, which needs nvcc and the CUDA headers on the GPU host). The tarball holds the
# whole python package (no .pyc) but, of flashinfer/data/ (the 332 MB of sources and headers in the
# wheel), only:
#   data/aot/<uri>/<uri>.so  the two batch-MLA modules (fa3 = *_sm90, fa2), bf16, ckv 512,
#                            kpe 64, int32 indices, compiled here for sm_90a by FlashInfer's
#                            own JIT spec (gen_batch_mla_module -> ninja -> nvcc); FlashInfer
#                            loads data/aot/<uri>/<uri>.so as a prebuilt (AOT) module
#   data/csrc/{batch_mla_*.cu, batch_mla_config.jinja, tvm_ffi_utils.h}  (gen_batch_mla_module
#                            reads these even when the AOT .so is used)
#   data/include, data/cutlass/{include,tools/util/include}, data/cccl/{cub,thrust,
#   libcudacxx/include}, data/spdlog/include  (only for a JIT fallback on the GPU box)
# Nothing in FlashInfer is modified; no stub modules are needed (`import flashinfer` does not
# import cudnn-frontend, cutlass-dsl, cuda-tile, nccl4py or nccl-extensions).
set -euo pipefail
mkdir -p "${1:-.peers/build}"
CARRY="$(cd "${1:-.peers/build}" && pwd)"
W="${WORK:-/tmp/fi}"
FI_VER=0.7.2.post1
TVM_VER=0.1.15.post2
mkdir -p "$W" "$CARRY"
cd "$W"
PLAT=(--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip download -q --no-deps "${PLAT[@]}" --python-version 3.12 -d whl "flashinfer-python==$FI_VER"
pip download -q --no-deps "${PLAT[@]}" --python-version 3.12 -d whl312 "apache-tvm-ffi==$TVM_VER"
PYV=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
pip download -q --no-deps "${PLAT[@]}" --python-version "$PYV" -d whlhost "apache-tvm-ffi==$TVM_VER"
sha256sum whl/*.whl whl312/*.whl

# local build env (CPU torch is enough: the MLA JIT build does not link torch)
[ -d venv ] || python3 -m venv venv
. venv/bin/activate
pip install -q torch==2.13.0 click einops ninja numpy nvidia-ml-py packaging requests tabulate tqdm jinja2 typing-extensions
pip install -q --no-deps whl/flashinfer_python-$FI_VER-*.whl whlhost/apache_tvm_ffi-*.whl

# nvcc links with -lcuda; the .so ends up not needing it, but the linker wants a file
mkdir -p stub && echo "" > stub/empty.c && gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o stub/libcuda.so stub/empty.c
export FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE="$W/ws" CUDA_HOME=/usr/local/cuda \
       MAX_JOBS="$(nproc)" FLASHINFER_EXTRA_LDFLAGS="-L$W/stub"
python3 - <<'EOF'
import time, torch
from flashinfer.jit.attention.modules import gen_batch_mla_module
for be in ("fa3", "fa2"):
    spec = gen_batch_mla_module(be, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 512, 64, False)
    t = time.time(); spec.build(verbose=False)
    print(be, spec.name, "built in %.0f s" % (time.time() - t), spec.jit_library_path.exists(), flush=True)
EOF
deactivate

# trimmed package tree
rm -rf x pkg && mkdir -p x pkg && (cd x && unzip -q ../whl/flashinfer_python-$FI_VER-*.whl)
(cd x && tar --exclude='__pycache__' --exclude='flashinfer/data' -cf - flashinfer) | tar -xf - -C pkg
S=x/flashinfer/data; D=pkg/flashinfer/data
mkdir -p $D/csrc $D/cutlass/tools/util $D/cccl/libcudacxx $D/spdlog
cp $S/csrc/batch_mla_*.cu $S/csrc/batch_mla_config.jinja $S/csrc/tvm_ffi_utils.h $D/csrc/
cp -r $S/include $D/include
cp -r $S/cutlass/include $D/cutlass/include
cp -r $S/cutlass/tools/util/include $D/cutlass/tools/util/include
cp -r $S/cccl/cub $S/cccl/thrust $D/cccl/
cp -r $S/cccl/libcudacxx/include $D/cccl/libcudacxx/include
cp -r $S/spdlog/include $D/spdlog/include
for d in "$W"/ws/.cache/flashinfer/$FI_VER/90a/cached_ops/batch_mla_*/; do
  n=$(basename "$d"); mkdir -p $D/aot/$n; cp "$d/$n.so" $D/aot/$n/
done
(cd pkg && tar --owner=0 --group=0 -cf - flashinfer | xz -T0 -6 > "$CARRY/flashinfer_pkg.tar.xz")
rm -f "$CARRY"/apache_tvm_ffi-*.whl "$CARRY"/SHA256SUMS
cp whl312/apache_tvm_ffi-$TVM_VER-cp312-*.whl "$CARRY/"
(cd "$CARRY" && rm -f SHA256SUMS && sha256sum -- *.whl *.tar.xz > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS && cat SHA256SUMS)
du -sh "$CARRY"
