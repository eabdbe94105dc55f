#!/usr/bin/env bash
# Hardware counters for issue #4 (docs/PROFILE.md): `iokernels profile` under Nsight Compute for
# N = 1024, 4096, 16384, 65536 (float16, d = 64, M = 192 KB, batch = heads = 1): standard attention
# forward and backward, flash q_outer forward and flash backward, once with ncu's --cache-control all
# and once with none, clocks untouched. One ncu run per (N, cache control); JSON, text and a summary
# table go to $OUT (default results/profile). Run from the repository root on the GPU machine, with ncu
# on PATH. NS="1024 4096" picks sizes; BACKWARD=0 leaves the backward passes out.
# Memory: at N = 65536 standard attention's S, P (forward) and P, dP, dS (backward) are 8 GiB each in
# float16, so a run holds about 24 GiB plus ncu's copy of what a replayed kernel may write.
set -uo pipefail
OUT=${OUT:-results/profile}
NS=${NS:-"1024 4096 16384 65536"}
BACKWARD=${BACKWARD:-1}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
COMMON=(--d 64 --dtype float16 --sram 192KB --batch 1 --heads 1)
if [ "$BACKWARD" = 1 ]; then
    PLANS=(--backward --algorithms standard,flash/q_outer,flash/kv_outer/bwd)
else
    PLANS=(--algorithms standard,flash/q_outer)
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v ncu && ncu --version | tail -1
  python3 -c "import cupy, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
  date -u
  echo "iokernels profile ${COMMON[*]} ${PLANS[*]} --N \$N --cache-control {all,none} --json"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
start=$SECONDS
for n in $NS; do
    for cc in all none; do  # cc inner: the second run finds the kernels compiled (cupy's disk cache)
        name="profile-N$n-cc-$cc"
        t0=$SECONDS
        if timeout 300 python3 -m iokernels.cli profile "${COMMON[@]}" "${PLANS[@]}" --N "$n" --cache-control "$cc" \
                --json > "$OUT/$name.json" 2>> "$OUT/err.txt"; then
            python3 -m iokernels.profile --render "$OUT/$name.json" > "$OUT/$name.txt"
            echo "$name: $((SECONDS - t0)) s"
        else
            echo "$name: FAILED (exit $?) after $((SECONDS - t0)) s; see $OUT/err.txt"
            rm -f "$OUT/$name.json"
        fi
    done
done
shopt -s nullglob
docs=("$OUT"/profile-N*-cc-*.json)
if [ ${#docs[@]} -gt 0 ]; then
    python3 -m iokernels.profile --summary "${docs[@]}" > "$OUT/summary.txt"
    cat "$OUT/summary.txt"
fi
echo "total $((SECONDS - start)) s"
tail -3 "$OUT/err.txt" 2>/dev/null
