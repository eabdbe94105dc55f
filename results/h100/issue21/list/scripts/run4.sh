# The causal forward with dropout on the list (ITEM_LIST, d up to 128): the plan-level A/B against a block per item in
# bands (dropout_probe.py), the GPU tests (the list against a block per item with dropout, the dropout tests), memcheck
# and racecheck on san_dropout_list.py, then `iokernels bench --causal --dropout 0.1` beside FA2 with dropout.
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/l6.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/l6; S=results/h100/issue21/list/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 $S/dropout_probe.py" > $R/commands.txt
timeout 150 python3 $S/dropout_probe.py > $R/dropout-probe.txt 2>&1; echo "rc $?" >> $R/dropout-probe.txt
cat $R/dropout-probe.txt
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 2 tests/gpu/test_causal.py -k "dropout_forward_on_the_list or item_list or head_bands" > $L/t-causal.log 2>&1; echo "rc $?" >> $L/t-causal.log) &
($T -n 2 tests/gpu/test_dropout_fast.py tests/gpu/test_library_dropout.py > $L/t-dropout.log 2>&1; echo "rc $?" >> $L/t-dropout.log) &
(for tool in memcheck racecheck; do timeout 90 compute-sanitizer --tool $tool python3 $S/san_dropout_list.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -10; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B="python3 -m iokernels.cli bench --causal --dropout 0.1 --d 64,128 --N 4096 --dtype float16 --mode call --impls torch --peers flash --repeats 10 --warmup 2 --time-budget 45"
echo "$B" >> $R/commands.txt
timeout 70 $B > $R/bench-causal-dropout.txt 2> $R/bench-causal-dropout.err; echo "rc $?" >> $R/bench-causal-dropout.txt
sed -n '/^d  /,/^$/p' $R/bench-causal-dropout.txt | head -20
tar czf $OUT/l6.tgz -C $OUT l6 && rm -rf $R
