#!/usr/bin/env bash
# The sweeps of docs/RESULTS-IO.md, on a GPU: N, d and M sweeps (flash and standard forward), the
# paper's block-size study (Figure 2, middle) and the regime M < d² (Saha & Ye). Each sweep writes
# NAME.json (the full document), NAME.txt (its text rendering), NAME.csv and NAME.png under $OUT
# (default results/sweeps). Run from the repository root; needs cupy, scipy and matplotlib
# (pip install -e '.[cuda13,sweep,plot]'). About 2-3 minutes on an H200, compiling included.
set -uo pipefail
OUT=${OUT:-results/sweeps}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
: > "$OUT/err.txt"
: > "$OUT/times.txt"

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, scipy, matplotlib, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'scipy', scipy.__version__, 'matplotlib', matplotlib.__version__, 'python', sys.version.split()[0])"
  git rev-parse HEAD 2>/dev/null
  date -u; } > "$OUT/env.txt"

# The forced tiles of the block study are new kernel shapes: counters == model and outputs against
# float64 on the GPU first (small ragged problems, a few seconds).
python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_forced_tiles.py > "$OUT/forced-tiles-tests.log" 2>&1
tail -1 "$OUT/forced-tiles-tests.log"

# Fits need scipy and plots matplotlib. Without them the sweeps still run (--no-fit, no --plot);
# then, where both are installed: python3 scripts/sweeps_post.py $OUT/*.json
OPTIONAL=()
if ! python3 -c "import scipy, matplotlib" 2> /dev/null; then
    echo "scipy or matplotlib missing: sweeping with --no-fit and no plots; run scripts/sweeps_post.py on the JSON later"
    OPTIONAL=(--no-fit)
fi

sweep() {  # sweep NAME ARGS...
    local name=$1 t0=$SECONDS rc
    shift
    local extra=("${OPTIONAL[@]}")
    [ ${#OPTIONAL[@]} -eq 0 ] && extra=(--plot "$OUT/$name.png")
    python3 -m iokernels.cli sweep "$@" --json --csv "$OUT/$name.csv" "${extra[@]}" \
        > "$OUT/$name.json" 2>> "$OUT/err.txt"
    rc=$?
    echo "iokernels sweep $* --json --csv $name.csv ${extra[*]}" > "$OUT/$name.txt"
    python3 -c "import json, sys; from iokernels import sweep; print(sweep.render(json.load(open(sys.argv[1]))))" \
        "$OUT/$name.json" >> "$OUT/$name.txt" 2>> "$OUT/err.txt"
    echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"
}

# 16 heads so that the grids fill more of the GPU (Algorithm 1 runs one block per head); no float64
# reference check at these sizes (host time): the forced-tile test above and tests/gpu check outputs.
COMMON=(--heads 16 --repeats 5 --no-check)
sweep N --vary N --values 1024,2048,4096,8192,16384 --algorithms flash,standard --d 64 --sram 192KB "${COMMON[@]}"
sweep d --vary d --values 16,32,64,128,256 --algorithms flash,standard --N 4096 --sram 192KB "${COMMON[@]}"
sweep M --vary M --values 16KB,24KB,32KB,48KB,64KB,96KB,128KB,192KB,227KB --algorithms flash,standard \
    --N 4096 --d 64 "${COMMON[@]}"
# The paper's Figure 2 (middle): N = 1024, d = 64, batch 8 x 16 heads, resident block 64..512.
for t in float16 float32; do
    sweep "block-$t" --vary block --values 64,128,256,512 --N 1024 --d 64 --sram 227KB --dtype "$t" \
        --batch 8 --heads 16 --repeats 5 --no-check
done
# M < d²: d = 256, so d² = 65,536 elements = 256 KB of float32 (every M the H200 allows is below it)
# or 128 KB of float16 (the sweep crosses it). One head, outputs checked against float64.
for t in float32 float16; do
    sweep "M-below-d2-$t" --vary M --values 32KB,48KB,64KB,96KB,128KB,160KB,192KB,227KB --algorithms flash \
        --N 2048 --d 256 --dtype "$t" --repeats 3
done
tail -3 "$OUT/err.txt"
