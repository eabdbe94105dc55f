#!/usr/bin/env bash
# One device call of the GPU checks, in parts (each on when listed in PARTS):
#   tests  the GPU tests except the slow ones, in TEST_GROUPS parallel pytest processes on the one GPU
#          (correctness and counters only; timing is measured elsewhere, one process at a time)
#   slow   the slow GPU tests (2^31-element sizes, N = 1,048,576)
#   san    compute-sanitizer over every kernel variant (scripts/sanitize.sh; SAN_ARGS, e.g. --quick)
#   meas   iokernels info and warmup, CUDA-graph launch overhead, first-call latency, compare with
#          grouped-query attention
#   sparse compare and sweep with --block-sparse (density 0.25; density 0.125 to 1)
#   drop   compare with --dropout 0.1 and with --mask (float32 research plans and standard; float16 with
#          the tensor-core path), and bench --dropout 0.1 against torch SDPA with the same dropout
# Writes logs to $OUT (default results/session-gpu). Run from the repository root on the GPU machine.
set -uo pipefail
OUT=${OUT:-results/session-gpu}
PARTS=${PARTS:-"tests slow san meas"}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
start=$(date +%s)
elapsed() { echo "$1 done after $(( $(date +%s) - start )) s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
  python3 -c "import torch; print('torch', torch.__version__, 'cuDNN', torch.backends.cudnn.version())"
  git rev-parse --short HEAD 2>/dev/null
  date -u; } > "$OUT/env.txt" 2>&1

has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    files=(tests/gpu/test_*.py)
    n=${TEST_GROUPS:-3}
    pids=()
    for ((g = 0; g < n; g++)); do
        group=()
        for ((i = g; i < ${#files[@]}; i += n)); do group+=("${files[i]}"); done
        timeout "${TEST_LIMIT:-540}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -m "not slow" \
            "${group[@]}" > "$OUT/gpu-tests-$g.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    for ((g = 0; g < n; g++)); do echo "group $g:"; tail -2 "$OUT/gpu-tests-$g.log"; done
    grep -h "^FAILED\|^ERROR" "$OUT"/gpu-tests-*.log | head -40
    elapsed tests
fi
if has slow; then
    timeout "${SLOW_LIMIT:-300}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -m slow \
        tests/gpu/test_limits.py tests/gpu/test_long_sequence.py > "$OUT/gpu-slow.log" 2>&1
    tail -3 "$OUT/gpu-slow.log"; grep "^FAILED" "$OUT/gpu-slow.log"
    elapsed slow
fi
if has san; then
    OUT="$OUT/sanitize" timeout "${SAN_LIMIT:-480}" bash scripts/sanitize.sh ${SAN_ARGS:-} > "$OUT/sanitize.log" 2>&1
    tail -15 "$OUT/sanitize.log"
    elapsed sanitize
fi
if has meas; then
    python3 -m iokernels.cli info > "$OUT/info.txt" 2>&1
    python3 -m iokernels.cli warmup > "$OUT/warmup.txt" 2>&1
    timeout 120 python3 scripts/graph_overhead.py --N 128,256 > "$OUT/graph-overhead.txt" 2>&1
    timeout 200 python3 scripts/first_call_latency.py > "$OUT/first-call-latency.txt" 2>&1
    python3 -m iokernels.cli compare --N 4096 --d 64 --sram 227KB --dtype float16 --heads 8 --kv-heads 2 \
        --backward > "$OUT/compare-gqa-h8-kv2.txt" 2>&1
    for f in graph-overhead first-call-latency compare-gqa-h8-kv2; do echo "== $f"; tail -14 "$OUT/$f.txt"; done
    elapsed meas
fi
if has sparse; then
    python3 -m iokernels.cli compare --N 4096 --d 64 --sram 192KB --block-sparse 0.25 --backward \
        > "$OUT/compare-sparse-0.25.txt" 2>&1
    timeout 200 python3 -m iokernels.cli sweep --vary density --values 0.125,0.25,0.5,1 --N 4096 --d 64 --sram 192KB \
        --backward > "$OUT/sweep-density.txt" 2>&1
    for f in compare-sparse-0.25 sweep-density; do echo "== $f"; tail -24 "$OUT/$f.txt"; done
    elapsed sparse
fi
if has drop; then
    python3 -m iokernels.cli compare --N 4096 --d 64 --sram 192KB --dropout 0.1 --backward \
        > "$OUT/compare-dropout-fp32.txt" 2>&1
    python3 -m iokernels.cli compare --N 4096 --d 64 --sram 227KB --dtype float16 --dropout 0.1 --causal \
        --backward > "$OUT/compare-dropout-causal-fp16.txt" 2>&1
    python3 -m iokernels.cli compare --N 2048 --d 64 --sram 192KB --mask bool --backward \
        > "$OUT/compare-mask-bool.txt" 2>&1
    python3 -m iokernels.cli compare --N 1024 --d 64 --sram 192KB --heads 4 --mask additive --mask-per-head \
        --backward > "$OUT/compare-mask-additive-per-head.txt" 2>&1
    timeout "${BENCH_LIMIT:-240}" python3 -m iokernels.cli bench --dropout 0.1 --d 64,128 --N 4096,16384 \
        --dtype float16 --impls fast --peers flash,cudnn,efficient --max-call-ms 500 \
        > "$OUT/bench-dropout-fp16.txt" 2>&1
    for f in compare-dropout-causal-fp16 compare-mask-bool compare-mask-additive-per-head bench-dropout-fp16; do
        echo "== $f"; tail -40 "$OUT/$f.txt"; done
    elapsed drop
fi
