#!/usr/bin/env bash
# One device call that proves the kernels and records the results: GPU tests, the headline compare
# (text and JSON, forward and backward) and the kernel benchmark. Logs go to $OUT (default results/run).
# Usage: bash scripts/gpu_run.sh [pytest -k expression]
set -uo pipefail
OUT=${OUT:-results/run}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
py=python3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c "import cupy, sys; print('cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
$py -m pytest -q -p no:cacheprovider tests/gpu ${1:+-k "$1"} 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
headline=(--N 4096 --d 64 --sram 192KB)
$py -m iokernels.cli compare "${headline[@]}" --backward > "$OUT/compare.txt" 2> "$OUT/compare.err"
$py -m iokernels.cli compare "${headline[@]}" --backward --json > "$OUT/compare.json" 2>> "$OUT/compare.err"
$py -m iokernels.cli kernel-bench "${headline[@]}" --dtype float16 --backward > "$OUT/kernel-bench-float16.txt" 2>&1
$py -m iokernels.cli kernel-bench "${headline[@]}" --dtype float32 --backward > "$OUT/kernel-bench-float32.txt" 2>&1
tail -3 "$OUT/compare.err"
cat "$OUT/compare.txt" | tail -45
cat "$OUT/kernel-bench-float16.txt"
