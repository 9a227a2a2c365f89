#!/usr/bin/env bash
# One device call: STEPS, in order, e.g. STEPS="tests e2e:new rec:defrag rec:cudagraph".
#   tests      the change's GPU tests
#   e2e:new    frontier's end-to-end gates on this tree; e2e:base on main before the change
#   rec:PHASE  runner gate PHASE --out (the recording); ONLY_<phase>=gates for --only
# A step is skipped when fewer than its expected seconds are left of BUDGET_S.
set -uo pipefail
[ -n "${NO_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi 2>/dev/null --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
start=$(date +%s)
declare -A EXPECT=([tests]=40 [e2e:new]=120 [e2e:base]=120 [rec:backend]=400 [rec:speculation]=345 [rec:cudagraph]=175 [rec:defrag]=90)
left() { echo $(( ${BUDGET_S:-585} - ($(date +%s) - start) )); }
for step in $STEPS; do
  need=${EXPECT[$step]:-60}
  if [ "$(left)" -lt "$need" ]; then echo "skip $step: $(left)s left, needs ~${need}s"; continue; fi
  case $step in
  tests)
    timeout 150 python -m pytest -q -m gpu tests/backend/test_fused.py 2>&1 | tee $R/gpu-tests.log | tail -5 ;;
  e2e:*)
    t=${step#e2e:}; d=$PWD
    if [ $t = base ]; then
      rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.device . | tar xf - -C /tmp/base \
        && cp .device/base/deepseek_v3.py .device/base/fused.py /tmp/base/serving/model/ && d=/tmp/base
    fi
    (cd $d && timeout $(( $(left) - 5 )) python -m runner gate frontier --only end-to-end,end-to-end-fp8 --out $R/e2e-$t.json) > $R/e2e-$t.out 2>&1
    echo "rc=$?"; grep -E "PASS|FAIL|BLOCK" $R/e2e-$t.out | head -6 ;;
  rec:*)
    ph=${step#rec:}; only_var=ONLY_$ph; only=${!only_var:-}
    timeout $(( $(left) - 5 )) python -m runner gate $ph ${only:+--only $only} --out $R/results-$ph.json > $R/$ph.out 2>&1
    echo "rc=$?"; tail -12 $R/$ph.out ;;
  esac
  echo "== $step done at $(( $(date +%s) - start ))s"
done
cd $OUT && tar czf r.tgz r && rm -rf r
