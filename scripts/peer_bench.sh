#!/usr/bin/env bash
# Issue #5's benchmark on one GPU: `iokernels bench` with every implementation and peer (torch SDPA
# FLASH/CUDNN/EFFICIENT/MATH, cupy/cuBLAS, the research plans, the fast path), as JSON and text.
#   main: d 64,128; N 1024,4096,16384 with B*H*N = 262144 (16 heads); float16, bfloat16; fwd + bwd
#   long: heads 48, d 64, batch 1, float16, N = 512, 1024, ..., 65536: the N² implementations (standard,
#         MATH) run out of memory on the way (-1); the flash ones do not before 65536, and N = 131072 would
#         take about 5 minutes of calls (LONG_MAX_N raises it)
# main takes about 4 minutes, long about 4: 20 timed calls per measurement, but a configuration whose one call
# exceeds --max-call-ms (or is estimated to, from the same implementation at a smaller N) is skipped
# and labelled, and each run has a --time-budget after which the rest is skipped and labelled (so the
# JSON is always written); `timeout` is the hard stop. The research flash kv_outer forward (Algorithm 1,
# one block per head, tens of ms per call) runs only where it stays under the per-call limit.
#
# Run from the repository root on the GPU machine: OUT=/some/dir scripts/peer_bench.sh
#   SMOKE=0: skip the GPU smoke test (tests/gpu/test_peerbench.py) that runs first and warms the
#            kernel cache; PARTS="main long" (default) or one of them; PACK=1: leave only $OUT/peer-bench.tgz.
set -uo pipefail
OUT=${OUT:-results/peer-bench}
FINAL=$OUT
if [ "${PACK:-0}" = 1 ]; then OUT=$(mktemp -d); fi
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader 2>&1
  $PY -c "import sys; print('python', sys.version.split()[0])"
  $PY -c "import cupy; print('cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion())" 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), 'GPU', torch.cuda.is_available())" 2>&1
  git rev-parse HEAD 2>/dev/null; git status --porcelain --untracked-files=no 2>/dev/null
  date -u; } > "$OUT/env.txt"

if [ "${SMOKE:-1}" = 1 ]; then
    timeout 120 $PY -m pytest -q -p no:cacheprovider --tb=short -rfs tests/gpu/test_peerbench.py > "$OUT/smoke-tests.log" 2>&1
    tail -2 "$OUT/smoke-tests.log"
fi

bench() {  # name hard-timeout-seconds args...
    local name=$1 hard=$2
    shift 2
    timeout "$hard" $PY -m iokernels.cli bench "$@" --json > "$OUT/bench-$name.json" 2> "$OUT/bench-$name.log"
    echo "bench $name: exit $? after $(( $(date +%s) - start )) s"
    $PY -c "import json, sys; from iokernels import peerbench; print(peerbench.render(json.load(open(sys.argv[1]))))" \
        "$OUT/bench-$name.json" > "$OUT/bench-$name.txt" 2>> "$OUT/bench-$name.log"
}
for part in ${PARTS:-main long}; do
    case $part in
        main) bench main 210 --d 64,128 --N 1024,4096,16384 --tokens 262144 --heads 16 --dtype float16,bfloat16 \
                  --backward --impls all --peers all --repeats 20 --warmup 3 --max-call-ms 150 --time-budget 140 ;;
        long) bench long 290 --long-only --long-dtype float16 --long-max-n "${LONG_MAX_N:-65536}" --backward \
                  --impls all --peers all --repeats 20 --warmup 3 --max-call-ms 1500 --time-budget 230 ;;
        *) echo "unknown part $part" >&2 ;;
    esac
done
echo "total $(( $(date +%s) - start )) s"
if [ "${PACK:-0}" = 1 ]; then mkdir -p "$FINAL" && tar czf "$FINAL/peer-bench.tgz" -C "$OUT" .; fi
