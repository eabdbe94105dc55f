#!/usr/bin/env bash
# The GPU suite: one device call that runs the chosen parts and writes each part's files into
# $OUT/<topic>/ (default OUT=results/<device>, <device> from nvidia-smi: "NVIDIA H200" -> h200), each
# topic folder with an env.txt (GPU, driver, versions, git commit, date) and a commands.txt (the exact
# commands of this run). Run from the repository root on the GPU machine, e.g.
#
#     PARTS="tests slow" bash scripts/gpu_suite.sh
#     PARTS=bench BENCH_SETS="main long" OUT=/tmp/out bash scripts/gpu_suite.sh
#
# Parts (PARTS, space-separated, run in this order; default "tests io"):
#   tests     tests/gpu without the slow tests, in TEST_GROUPS (default 3) pytest processes side by side
#             on the one GPU (correctness and counters only: nothing in tests/gpu reports a timing; the files
#             split into groups by size, largest first, so that the groups take about as long) -> tests/
#   slow      the slow GPU tests (-m slow: 2^31-element sizes, N = 1,048,576)                      -> tests/
#   sanitize  compute-sanitizer's memcheck, racecheck, initcheck and synccheck over every kernel variant
#             (python3 -m iokernels.analysis.sanitize; SAN_ARGS, e.g. "--quick" or "--tools memcheck") -> sanitize/
#   io        iokernels compare: counted against predicted bytes for the headline problem (float32
#             research plans; float16 with the tensor-core path), grouped-query, block-sparse, dropout
#             and explicit masks                                                                 -> io/
#   kbench    iokernels kernel-bench: every kernel stage, plain and counting builds, beside a copy's
#             bandwidth and cupy.matmul                                                          -> kernel-bench/
#   bench     iokernels bench: TFLOP/s of ours beside torch SDPA, FlexAttention and cupy/cuBLAS in the same
#             run, call and graph modes; host µs per call; BENCH_SETS (default "main overhead"; also long,
#             causal, dropout)                                                                   -> bench/
#   sweeps    iokernels sweep: N, d, M, the block-size study, M < d², block-sparse density, with
#             exponent fits and plots (scripts/sweeps_post.py writes NAME.txt and NAME.png)       -> sweeps/
#   paper     issue #19's research results: compare at its defaults (batch x heads that fill the GPU), float32
#             and float16 --backward; iokernels roofline of both; the block-size study of the tensor-core
#             research forward from B = 16                                                         -> paper/
#   fig2      iokernels paper fig2, ncu DRAM when ncu is on PATH (FIG2_PANELS, default left,middle,right; FIG2_ARGS) -> paper/fig2/
#   profile   iokernels profile under Nsight Compute (ncu on PATH), --cache-control all and none, for
#             PROFILE_NS (default "1024 4096 16384"; forward and backward) and PROFILE_FWD_NS
#             (default 65536; forward only; set it empty for none); PROFILE_D: the head dim (64) -> profile/
#
# Rough H200 times: tests 5-6 min (6 groups), slow 20 s, sanitize 6 min, io 1-2 min, kbench 1 min,
# bench main 5 min + overhead 1 min (long, causal, dropout: up to 6, 5, 5 min), sweeps 3 min, profile 3-4 min. Pick
# parts so that one call stays within its time limit. Other variables: TEST_LIMIT, SLOW_LIMIT, SAN_LIMIT
# (seconds per pytest / sanitizer process), DEVICE (the folder name), COMMIT (written to env.txt beside
# `git rev-parse HEAD`, for copies whose .git is stale), PACK=1 (leave only $OUT/suite.tgz).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ -n "${COMMIT:-}" ]; then export IOKERNELS_COMMIT=$COMMIT; fi  # results that record a commit name this one
PY=${PYTHON:-python3}
IOK=("$PY" -m iokernels.cli)
PARTS=${PARTS:-"tests io"}
for p in $PARTS; do
    case $p in tests|slow|sanitize|io|kbench|bench|sweeps|paper|fig2|profile) ;;
        *) echo "unknown part $p: expected some of tests slow sanitize io kbench bench sweeps paper fig2 profile" >&2
           exit 2 ;;
    esac
done
if [ -z "${DEVICE:-}" ]; then
    DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr '[:upper:]' '[:lower:]' \
             | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
    DEVICE=${DEVICE:-no-gpu}
fi
ROOT=${OUT:-results/$DEVICE}
FINAL=$ROOT
if [ "${PACK:-0}" = 1 ]; then ROOT=$(mktemp -d); fi
mkdir -p "$ROOT"
start=$SECONDS
status=0

# Text tables of saved JSON documents: the functions the CLI prints with (no CLI command re-reads a
# JSON file). Profile and sweeps have entry points of their own (iokernels.analysis.profile, sweeps_post.py).
BENCH_RENDER=iokernels.bench.suite
KBENCH_RENDER=iokernels.bench.stages

has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
elapsed() { echo "== $1 done after $((SECONDS - start)) s"; }

env_txt() {  # the provenance of a part: GPU, versions, commit, date
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$PY" - <<'EOF' 2>&1
import importlib, platform
print("python", platform.python_version())
for name in ("iokernels", "numpy", "cupy", "torch", "scipy", "matplotlib"):
    try:
        m = importlib.import_module(name)
    except Exception as exc:
        print(name, "missing:", type(exc).__name__)
        continue
    extra = ""
    if name == "cupy":
        try:
            extra = (f"  CUDA runtime {m.cuda.runtime.runtimeGetVersion()}  driver API {m.cuda.runtime.driverGetVersion()}"
                     f"  NVRTC {'.'.join(map(str, m.cuda.nvrtc.getVersion()))}")
        except Exception as exc:
            extra = f"  (no device: {type(exc).__name__})"
    if name == "torch":
        extra = f"  CUDA {m.version.cuda}  cuDNN {m.backends.cudnn.version()}  GPU {m.cuda.is_available()}"
    print(name, getattr(m, "__version__", "?") + extra)
EOF
    if command -v ncu > /dev/null; then echo "ncu $(command -v ncu): $(ncu --version | tail -1)"; fi
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)${COMMIT:+ (given: $COMMIT)}," \
         "$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) tracked files modified"
    date -u
}

part_dir() {  # part_dir TOPIC: make $ROOT/TOPIC with this run's env.txt, empty commands.txt and err.txt
    DIR=$ROOT/$1
    mkdir -p "$DIR"
    env_txt > "$DIR/env.txt"
    : > "$DIR/commands.txt"
    : > "$DIR/err.txt"
}

run() {  # run LIMIT_S STDOUT_FILE CMD...: record the command, run it under timeout, stderr to err.txt
    local limit=$1 dest=$2 rc
    shift 2
    echo "$* > $(basename "$dest")" >> "$DIR/commands.txt"
    echo "# $*" >> "$DIR/err.txt"
    timeout "$limit" "$@" > "$dest" 2>> "$DIR/err.txt"
    rc=$?
    [ $rc = 0 ] || { echo "exit $rc: $*" | tee -a "$DIR/err.txt"; status=1; }
    [ -s "$dest" ] || rm -f "$dest"  # a command that failed before printing leaves no empty file
    return $rc
}

render() {  # render MODULE JSON TXT: the text table of a saved JSON document
    [ -s "$2" ] || return 0
    "$PY" -c "import importlib, json, sys; print(importlib.import_module(sys.argv[1]).render(json.load(open(sys.argv[2]))))" \
        "$1" "$2" > "$3" 2>> "$DIR/err.txt" || echo "no text table for $2 (see err.txt); the JSON is kept"
}

gpu_test_files() { find tests/gpu -name 'test_*.py' | sort; }

if has tests; then
    part_dir tests
    mapfile -t files < <(gpu_test_files)
    n=${TEST_GROUPS:-3}
    pids=()
    rm -f "$DIR"/gpu-tests-*.log
    # the files in n groups of about equal size (largest first, each to the group with the fewest bytes so far:
    # a file's size stands for its run time, times a weight where that misleads: test_causal.py's parameters make it
    # ~500 s alone on an H100, results/h100/issue22/suite-516eec2), each group in file order
    mapfile -t groups < <("$PY" -c '
import os, sys
n, files = int(sys.argv[1]), sys.argv[2:]
weight = {"test_causal.py": 4}
cost = lambda f: os.path.getsize(f) * weight.get(os.path.basename(f), 1)
groups, sizes = [[] for _ in range(n)], [0] * n
for f in sorted(files, key=cost, reverse=True):
    g = sizes.index(min(sizes))
    groups[g].append(f)
    sizes[g] += cost(f)
print("\n".join(" ".join(sorted(g)) for g in groups))' "$n" "${files[@]}")
    for ((g = 0; g < n; g++)); do
        read -r -a group <<< "${groups[g]:-}"
        [ ${#group[@]} -gt 0 ] || continue
        cmd=("$PY" -m pytest -q -p no:cacheprovider --tb=short -rfE -m "not slow" "${group[@]}")
        echo "${cmd[*]} > gpu-tests-$g.log" >> "$DIR/commands.txt"
        timeout "${TEST_LIMIT:-540}" "${cmd[@]}" > "$DIR/gpu-tests-$g.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    for ((g = 0; g < n; g++)); do [ -f "$DIR/gpu-tests-$g.log" ] && echo "group $g: $(tail -1 "$DIR/gpu-tests-$g.log")"; done
    grep -h "^FAILED\|^ERROR" "$DIR"/gpu-tests-*.log | head -40
    elapsed tests
fi

if has slow; then
    [ -n "${DIR:-}" ] && [ "$DIR" = "$ROOT/tests" ] || part_dir tests
    mapfile -t files < <(gpu_test_files)
    cmd=("$PY" -m pytest -q -p no:cacheprovider --tb=short -rfE -m slow "${files[@]}")
    echo "${cmd[*]} > gpu-slow.log" >> "$DIR/commands.txt"
    timeout "${SLOW_LIMIT:-300}" "${cmd[@]}" > "$DIR/gpu-slow.log" 2>&1 || status=1
    tail -1 "$DIR/gpu-slow.log"; grep "^FAILED\|^ERROR" "$DIR/gpu-slow.log"
    elapsed slow
fi

if has sanitize; then
    part_dir sanitize
    # writes summary.txt, summary.json, variants.txt and one log per tool and shard into the folder;
    # exits 1 on any error, 2 without compute-sanitizer
    # shellcheck disable=SC2086
    run "${SAN_LIMIT:-540}" "$DIR/sanitize.log" "$PY" -m iokernels.analysis.sanitize --out "$DIR" ${SAN_ARGS:-}
    tail -12 "$DIR/sanitize.log"
    elapsed sanitize
fi

if has io; then
    part_dir io
    H=(--N 4096 --d 64 --sram 192KB --backward)
    run 300 "$DIR/compare-4096-d64-192KB.txt" "${IOK[@]}" compare "${H[@]}"
    run 300 "$DIR/compare-4096-d64-192KB.json" "${IOK[@]}" compare "${H[@]}" --json
    for d in 64 128; do  # the tensor-core path (flash/fast) beside the research plans
        run 300 "$DIR/compare-4096-d$d-fp16.txt" "${IOK[@]}" compare --N 4096 --d $d --sram 227KB --dtype float16 --backward
    done
    run 300 "$DIR/compare-gqa-h8-kv2.txt" "${IOK[@]}" compare --N 4096 --d 64 --sram 227KB --dtype float16 \
        --heads 8 --kv-heads 2 --backward
    run 300 "$DIR/compare-sparse-0.25.txt" "${IOK[@]}" compare "${H[@]}" --block-sparse 0.25
    run 300 "$DIR/compare-dropout-fp32.txt" "${IOK[@]}" compare "${H[@]}" --dropout 0.1
    run 300 "$DIR/compare-dropout-causal-fp16.txt" "${IOK[@]}" compare --N 4096 --d 64 --sram 227KB --dtype float16 \
        --dropout 0.1 --causal --backward
    run 300 "$DIR/compare-mask-bool.txt" "${IOK[@]}" compare --N 2048 --d 64 --sram 192KB --mask bool --backward
    run 300 "$DIR/compare-mask-additive-per-head.txt" "${IOK[@]}" compare --N 1024 --d 64 --sram 192KB --heads 4 \
        --mask additive --mask-per-head --backward
    for f in "$DIR"/compare-*.txt; do  # the distinct meas/pred values of the total rows: 1.000 alone expected
        echo "$(basename "$f"): meas/pred $(awk '$5 == "total" {print $8}' "$f" | sort -u | tr '\n' ' ')"
    done
    elapsed io
fi

if has paper; then
    part_dir paper
    H=(--N 4096 --d 64 --sram 192KB)
    for spec in f32: f16-bwd:"--dtype float16 --backward"; do
        IFS=: read -r name extra <<< "$spec"
        # shellcheck disable=SC2086
        run 300 "$DIR/compare-$name.txt" "${IOK[@]}" compare "${H[@]}" $extra
        # shellcheck disable=SC2086
        run 300 "$DIR/roofline-$name.json" "${IOK[@]}" roofline "${H[@]}" $extra --json --plot "$DIR/roofline-$name.png" \
            && render iokernels.analysis.roofline "$DIR/roofline-$name.json" "$DIR/roofline-$name.txt"
    done
    for s in kv_outer q_outer; do  # from B = 16, where the tensor-core research forward is memory-bound
        run 300 "$DIR/block-$s.txt" "${IOK[@]}" sweep --vary block --values 16,32,64,128,256,512 --N 1024 --d 64 \
            --dtype float16 --batch 64 --heads 16 --sram 227KB --schedules $s
    done
    elapsed paper
fi

if has fig2; then
    part_dir paper/fig2
    NCU=(); command -v ncu > /dev/null || NCU=(--no-ncu)
    # shellcheck disable=SC2086
    run 540 "$DIR/fig2.json" "${IOK[@]}" paper fig2 --panels "${FIG2_PANELS:-left,middle,right}" "${NCU[@]}" ${FIG2_ARGS:-} \
        --json --plot "$DIR/fig2.png" && render iokernels.analysis.figure2 "$DIR/fig2.json" "$DIR/fig2.txt"
    elapsed fig2
fi

if has kbench; then
    part_dir kernel-bench
    H=(--N 4096 --d 64 --sram 192KB --backward)
    # 64 heads: B*H*N = 262144 as in FlashAttention-2's benchmarks, so the grids fill the GPU; float16
    # also at 16 heads, where the smallest kernels run for a few microseconds
    for spec in float16:float16:64 float32:float32:64 float16-heads16:float16:16; do
        IFS=: read -r name dtype heads <<< "$spec"
        run 300 "$DIR/kernel-bench-$name.json" "${IOK[@]}" kernel-bench "${H[@]}" --dtype "$dtype" --heads "$heads" --json \
            && render "$KBENCH_RENDER" "$DIR/kernel-bench-$name.json" "$DIR/kernel-bench-$name.txt"
    done
    elapsed kbench
fi

if has bench; then
    part_dir bench
    # Every implementation in one process, timed the same way.
    # A configuration whose one call exceeds --max-call-ms (or is estimated to, from a smaller N) is
    # skipped and labelled; past --time-budget the rest is skipped and labelled, so the JSON is always
    # written; `timeout` is the hard stop. The research flash kv_outer forward (Algorithm 1, one block
    # per head, tens of ms per call) runs only where it stays under the per-call limit.
    # Ours through the public calls (iokernels.torch.attention, iokernels.attention on cupy arrays) and every
    # peer, in call mode beside graph mode (results/h200/bench/README.md).
    COMMON=(--backward --repeats 20 --warmup 3)
    for set in ${BENCH_SETS:-main overhead}; do
        renderer=$BENCH_RENDER
        case $set in
            main)  # d 64, 128; N 512 to 16384 with B*H*N = 262144 (16 heads); float16, bfloat16 (~5 min)
                name=bench limit=440
                args=(--mode both --d 64,128 --N 512,1024,4096,16384 --dtype float16,bfloat16 --max-call-ms 2000
                      --time-budget 400) ;;
            overhead)  # host microseconds per call, forward and forward+backward (~1 min)
                name=overhead limit=150 renderer=iokernels.bench.overhead
                args=(--overhead --d 64 --N 512,4096) ;;
            long)  # heads 48, d 64, batch 1, float16, N = 512 ... LONG_MAX_N
                name=bench-long limit=400
                args=(--mode both --long-only --long-dtype float16 --long-max-n "${LONG_MAX_N:-65536}"
                      --max-call-ms 1500 --time-budget 360) ;;
            causal)
                name=bench-causal limit=300
                args=(--mode both --causal --d 64,128 --N 4096,16384 --dtype float16,bfloat16 --time-budget 260) ;;
            dropout)  # each implementation draws its own mask: only the times compare
                name=bench-dropout limit=300
                args=(--mode both --dropout 0.1 --d 64,128 --N 4096,16384 --dtype float16 --max-call-ms 500
                      --time-budget 260) ;;
            *) echo "unknown bench set $set" >&2; status=1; continue ;;
        esac
        run $limit "$DIR/$name.json" "${IOK[@]}" bench "${args[@]}" "${COMMON[@]}" --json
        render "$renderer" "$DIR/$name.json" "$DIR/$name.txt"
        echo "$name after $((SECONDS - start)) s"
    done
    elapsed bench
fi

if has sweeps; then
    part_dir sweeps
    # The forced tiles of the block study are kernel shapes of their own: counters == model and outputs
    # against float64 on the GPU first (small ragged problems, a few seconds).
    forced=$(gpu_test_files | grep '/test_forced_tiles.py$' | head -1)
    if [ -n "$forced" ]; then
        cmd=("$PY" -m pytest -q -p no:cacheprovider --tb=short -rf "$forced")
        echo "${cmd[*]} > forced-tiles-tests.log" >> "$DIR/commands.txt"
        "${cmd[@]}" > "$DIR/forced-tiles-tests.log" 2>&1 || status=1
        tail -1 "$DIR/forced-tiles-tests.log"
    fi
    # Fits need scipy, plots matplotlib; without scipy the sweeps run with --no-fit, and
    # `python3 scripts/sweeps_post.py DIR/*.json` adds the fits and plots later, where both are installed.
    NOFIT=()
    "$PY" -c "import scipy" 2> /dev/null || { NOFIT=(--no-fit); echo "scipy missing: sweeping with --no-fit"; }
    : > "$DIR/times.txt"
    sweep() {  # sweep NAME ARGS...: NAME.json, NAME.csv, then NAME.txt (command + table) and NAME.png
        local name=$1 t0=$SECONDS
        shift
        run 300 "$DIR/$name.json" "${IOK[@]}" sweep "$@" "${NOFIT[@]}" --json --csv "$DIR/$name.csv"
        echo "$name: exit $?, $((SECONDS - t0)) s" | tee -a "$DIR/times.txt"
        echo "iokernels sweep $* ${NOFIT[*]} --json --csv $name.csv" > "$DIR/$name.txt"
        [ -s "$DIR/$name.json" ] && { "$PY" scripts/sweeps_post.py "$DIR/$name.json" >> "$DIR/err.txt" 2>&1 || status=1; }
    }
    # 16 heads so that the grids fill more of the GPU (Algorithm 1 runs one block per head); no float64
    # reference check at these sizes (host time): the forced-tile tests above and tests/gpu check outputs.
    C=(--heads 16 --repeats 5 --no-check)
    sweep N --vary N --values 1024,2048,4096,8192,16384 --algorithms flash,standard --d 64 --sram 192KB "${C[@]}"
    sweep d --vary d --values 16,32,64,128,256 --algorithms flash,standard --N 4096 --sram 192KB "${C[@]}"
    sweep M --vary M --values 16KB,24KB,32KB,48KB,64KB,96KB,128KB,192KB,227KB --algorithms flash,standard \
        --N 4096 --d 64 "${C[@]}"
    # The paper's Figure 2 (middle): N = 1024, d = 64, batch 8 x 16 heads, resident block 64 to 512.
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
    # Block-sparse attention (the paper's Algorithm 5): bytes and time against the density of the mask.
    sweep density --vary density --values 0.125,0.25,0.5,1 --N 4096 --d 64 --sram 192KB --backward
    elapsed sweeps
fi

if has profile; then
    part_dir profile
    # One ncu session per (N, cache control), clocks left alone (float16, d PROFILE_D (default 64; other
    # values name their files profile-dD-N...), M 192 KB, batch = heads = 1).
    # Memory: at N = 65536 standard attention's S, P (forward) and P, dP, dS (backward) are 8 GiB each
    # in float16, plus ncu's copy of what a replayed kernel may write: hence forward only there.
    P=(--d "${PROFILE_D:-64}" --dtype float16 --sram 192KB --batch 1 --heads 1)
    tag=""; [ "${PROFILE_D:-64}" = 64 ] || tag="d${PROFILE_D}-"
    profile_n() {  # profile_n N ALGORITHM-ARGS...
        local n=$1 cc name
        shift
        for cc in all none; do  # cc inner: the second run finds the kernels compiled (cupy's disk cache)
            name=profile-${tag}N$n-cc-$cc
            if run 300 "$DIR/$name.json" "${IOK[@]}" profile "${P[@]}" "$@" --N "$n" --cache-control $cc --json; then
                "$PY" -m iokernels.analysis.profile --render "$DIR/$name.json" > "$DIR/$name.txt" 2>> "$DIR/err.txt"
            else
                rm -f "$DIR/$name.json"  # a partial document would spoil summary.txt
            fi
            echo "$name after $((SECONDS - start)) s"
        done
    }
    for n in ${PROFILE_NS-1024 4096 16384}; do
        profile_n "$n" --backward --algorithms standard,flash/q_outer,flash/kv_outer/bwd
    done
    for n in ${PROFILE_FWD_NS-65536}; do
        profile_n "$n" --algorithms standard,flash/q_outer
    done
    shopt -s nullglob
    docs=("$DIR"/profile-${tag}N*-cc-*.json)
    if [ ${#docs[@]} -gt 0 ]; then
        echo "python3 -m iokernels.analysis.profile --summary profile-${tag}N*-cc-*.json > ${tag}summary.txt" \
            >> "$DIR/commands.txt"
        "$PY" -m iokernels.analysis.profile --summary "${docs[@]}" > "$DIR/${tag}summary.txt" 2>> "$DIR/err.txt"
        cat "$DIR/${tag}summary.txt"
    fi
    shopt -u nullglob
    elapsed profile
fi

echo "total $((SECONDS - start)) s, files under $FINAL, exit $status"
if [ "${PACK:-0}" = 1 ]; then mkdir -p "$FINAL" && tar czf "$FINAL/suite.tgz" -C "$ROOT" .; fi
exit $status
