#!/usr/bin/env bash
# Issue #5's device call: the GPU tests, `compare` at float16 (the flash/fast rows beside the
# research plans), the forward probe of every tensor-core kernel variant, and `iokernels bench`
# (scripts/peer_bench.sh: ours beside torch SDPA and cupy/cuBLAS, main and long-sequence tables).
# Writes to $OUT (default results/issue5-run); PACK=1 leaves only $OUT/issue5.tgz (the device tool
# returns few files). Run from the repository root on the GPU machine. Parts, each on unless set to 0:
# TESTS, COMPARE, PROBE, BENCH (PARTS="main long" as in peer_bench.sh).
set -uo pipefail
OUT=${OUT:-results/issue5-run}
FINAL=$OUT
if [ "${PACK:-0}" = 1 ]; then OUT=$(mktemp -d); fi
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
start=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
  python3 -c "import torch; print('torch', torch.__version__, 'cuDNN', torch.backends.cudnn.version())"
  date -u; } > "$OUT/env.txt" 2>&1
if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu > "$OUT/gpu-tests.log" 2>&1
    tail -3 "$OUT/gpu-tests.log"; echo "tests done after $(( $(date +%s) - start )) s"
fi
[ "${COMPARE:-1}" = 1 ] && for d in 64 128; do
    python3 -m iokernels.cli compare --N 4096 --d $d --sram 227KB --dtype float16 --backward \
        > "$OUT/compare-4096-d$d-fp16.txt" 2>> "$OUT/err.txt"
done
[ "${PROBE:-1}" = 1 ] && timeout 120 python3 scripts/fast_probe.py --quick > "$OUT/fast-probe.jsonl" 2>> "$OUT/err.txt"
[ "${PROBE:-1}" = 1 ] && timeout 200 python3 scripts/bwd_probe.py > "$OUT/bwd-probe.jsonl" 2>> "$OUT/err.txt"
echo "compare + probe done after $(( $(date +%s) - start )) s"
[ "${BENCH:-1}" = 1 ] && OUT="$OUT/bench" SMOKE=0 bash scripts/peer_bench.sh
echo "total $(( $(date +%s) - start )) s"
tail -5 "$OUT/err.txt" 2>/dev/null
if [ "${PACK:-0}" = 1 ]; then mkdir -p "$FINAL" && tar czf "$FINAL/issue5.tgz" -C "$OUT" .; fi
