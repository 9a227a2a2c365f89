#!/usr/bin/env bash
# On the GPU host (no package index needed), from the project root: install the carried peer builds
# of BUILD (default .peers/build: get_flashmla.sh, make_flashinfer.sh) into SITE (default
# /tmp/peers-site), outside the tree, then put SITE on PYTHONPATH for the runner and its gates:
#   bash phases/kernel/bench/peer_builds/install.sh [BUILD] [SITE]
#   export PYTHONPATH=/tmp/peers-site${PYTHONPATH:+:$PYTHONPATH}
# Nothing is installed over the host's torch: every wheel goes in with --no-deps.
set -euo pipefail
BUILD="${1:-.peers/build}"
SITE="${2:-/tmp/peers-site}"
[ -d "$BUILD" ] || { echo "no $BUILD: run get_flashmla.sh and make_flashinfer.sh where PyPI is reachable" >&2; exit 10; }
if [ -f "$BUILD/SHA256SUMS" ]; then
  (cd "$BUILD" && sha256sum -c --quiet SHA256SUMS) || { echo "$BUILD/SHA256SUMS does not match: rebuild" >&2; exit 11; }
fi
shopt -s nullglob
flashmla=("$BUILD"/sgl_flash_mla-*.whl)
tvm=("$BUILD"/apache_tvm_ffi-*.whl)
[ ${#flashmla[@]} -gt 0 ] || { echo "no sgl_flash_mla wheel in $BUILD: run get_flashmla.sh" >&2; exit 12; }
[ ${#tvm[@]} -gt 0 ] && [ -f "$BUILD/flashinfer_pkg.tar.xz" ] || {
  echo "no FlashInfer build in $BUILD: run make_flashinfer.sh" >&2; exit 13; }
mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "${flashmla[@]}" "${tvm[@]}"
python3 -c "
import sys, tarfile
extra = {'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}  # plain files only, inside SITE
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **extra)" "$BUILD/flashinfer_pkg.tar.xz" "$SITE"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 -c "
import importlib.util, sys
missing = [m for m in ('flash_mla', 'flashinfer', 'tvm_ffi') if importlib.util.find_spec(m) is None]
sys.exit(f'not found after the install: {missing}' if missing else 0)"
echo "peers installed in $SITE; export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
