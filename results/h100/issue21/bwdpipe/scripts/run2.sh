# issue #21: the bench tables of run6 (bc176/scripts/run6.sh: main, causal, widths, dropout, causal N 65,536) after the
# backward's new step order (9ae749a), same commands with slightly shorter time budgets. OUT=<dir>, COMMIT=<hash>; run from the
# repository root. Everything lands in $OUT/r2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/r2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
B=(python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=150 run bench-main --mode both --peers flash,cudnn,flex --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 130
LIMIT=100 run bench-causal --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 70
LIMIT=90 run bench-widths --mode both --peers flash,cudnn,flex --d 32,96,256 --N 4096 --dtype float16 --time-budget 70
LIMIT=80 run bench-dropout --mode call --peers flash,cudnn --dropout 0.1 --d 64,128 --N 4096 --dtype float16 --time-budget 60
LIMIT=80 run bench-causal-65536 --mode call --peers flash,cudnn --causal --d 128 --N 65536 --heads 4 --dtype float16 --max-call-ms 5000 --time-budget 60
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^over the main table/,$p' $f | grep -v "^  torch_flex skipped"; done
tar czf $OUT/r2.tgz -C $OUT r2 && rm -rf $R
