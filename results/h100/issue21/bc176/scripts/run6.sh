# issue #21: the bench again after its call mode keeps one untimed call in flight before each timed loop
# (iokernels/bench/clocks.py IN_FLIGHT): the main, causal, widths, dropout and causal N 65,536 tables of run3/run4 with
# the same commands, and the timing tests. OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
(timeout 120 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_timing.py tests/gpu/test_peerbench.py > $R/tests.log 2>&1; echo "rc $?" >> $R/tests.log)
tail -3 $R/tests.log
B=(python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=150 run bench-main --mode both --peers flash,cudnn,flex --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 130
LIMIT=110 run bench-causal --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 90
LIMIT=100 run bench-widths --mode both --peers flash,cudnn,flex --d 32,96,256 --N 4096 --dtype float16 --time-budget 80
LIMIT=80 run bench-dropout --mode call --peers flash,cudnn --dropout 0.1 --d 64,128 --N 4096 --dtype float16 --time-budget 60
LIMIT=80 run bench-causal-65536 --mode call --peers flash,cudnn --causal --d 128 --N 65536 --heads 4 --dtype float16 --max-call-ms 5000 --time-budget 60
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^over the main table/,$p' $f | grep -v "^  torch_flex skipped"; done
