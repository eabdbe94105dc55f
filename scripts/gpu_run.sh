#!/usr/bin/env bash
# The one device call that proves the kernels and records results/: GPU tests, the headline compare
# (text and JSON, forward and backward) and the kernel benchmark (float16 and float32 at 64 heads, so
# that B*H*N = 262144 as in FlashAttention-2's benchmarks and the grids fill the GPU; float16 also at
# 16 heads, where the smallest kernels run for a few microseconds). Writes to $OUT (default
# results/run); with PACK=1 (the device tool, which returns few files) the logs go to a scratch folder
# and only $OUT/run.tgz is left. Run from the repository root.
set -uo pipefail
OUT=${OUT:-results/run}
FINAL=$OUT
if [ "${PACK:-0}" = 1 ]; then OUT=$(mktemp -d); fi
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
H=(--N 4096 --d 64 --sram 192KB --backward)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
  date -u; } > "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"
python3 -m iokernels.cli compare "${H[@]}" > "$OUT/compare-4096-d64-192KB.txt" 2> "$OUT/err.txt"
python3 -m iokernels.cli compare "${H[@]}" --json > "$OUT/compare-4096-d64-192KB.json" 2>> "$OUT/err.txt"
bench() {  # name dtype heads
    python3 -m iokernels.cli kernel-bench "${H[@]}" --dtype "$2" --heads "$3" --json > "$OUT/kernel-bench-$1.json" 2>> "$OUT/err.txt"
    python3 -c "import json, sys; from iokernels import bench; print(bench.render(json.load(open(sys.argv[1]))))" \
        "$OUT/kernel-bench-$1.json" > "$OUT/kernel-bench-$1.txt"
}
bench float16 float16 64
bench float32 float32 64
bench float16-heads16 float16 16
tail -3 "$OUT/err.txt"
if [ "${PACK:-0}" = 1 ]; then tar czf "$FINAL/run.tgz" -C "$OUT" .; fi
