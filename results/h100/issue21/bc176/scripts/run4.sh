# issue #21, the rest of the bench after B_c 176 (forward, d 72-128 unmasked) and the backward's per-thread ring
# release: causal, d 32 / 96 / 256, dropout 0.1, causal N 65,536; ours beside SDPA FLASH and CUDNN (and FlexAttention
# compiled in the first two). OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
B=(python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=170 run bench-causal --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 150
LIMIT=140 run bench-widths --mode both --peers flash,cudnn,flex --d 32,96,256 --N 4096 --dtype float16 --time-budget 120
LIMIT=110 run bench-dropout --mode call --peers flash,cudnn --dropout 0.1 --d 64,128 --N 4096 --dtype float16 --time-budget 90
LIMIT=110 run bench-causal-65536 --mode call --peers flash,cudnn --causal --d 128 --N 65536 --heads 4 --dtype float16 --max-call-ms 5000 --time-budget 90
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^over the main table/,$p' $f; done
