# issue #23: the varlen forward at B_r 192 (three consumer warpgroups) by default at d up to 64: its GPU tests and the
# four sanitizers on every varlen launch, then bench --varlen at d 64 (causal and not). OUT=<dir>, COMMIT=<hash>; run
# from the repository root. Everything lands in $OUT/c8.tgz (the device returns few files).
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/c8; S=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
python3 $S/san_varlen.py --quick > /dev/null 2>&1
T="timeout 250 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_varlen.py tests/gpu/test_varlen_torch.py > $L/t-varlen.log 2>&1; echo "rc $?" >> $L/t-varlen.log) &
(for tool in memcheck synccheck initcheck; do timeout 80 compute-sanitizer --tool $tool python3 $S/san_varlen.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(timeout 250 compute-sanitizer --tool racecheck python3 $S/san_varlen.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B="python3 -m iokernels.cli bench --varlen --varlen-batch 64 --varlen-max 8192 --heads 16 --dtype float16 --mode both --repeats 10 --warmup 2"
echo "$B --d 64 --time-budget 100 --json; the same with --causal" > $R/commands.txt
timeout 120 $B --d 64 --time-budget 100 --json > $R/bench-varlen-d64.json 2> $R/bench-varlen-d64.err
timeout 120 $B --d 64 --causal --time-budget 100 --json > $R/bench-varlen-d64-causal.json 2> $R/bench-varlen-d64-causal.err
for f in $R/bench-varlen*.json; do python3 -c "import json,sys; from iokernels.bench import varlen; print(varlen.render(json.load(open(sys.argv[1]))))" $f > ${f%.json}.txt; cat ${f%.json}.txt; done
tar czf $OUT/c8.tgz -C $OUT c8 && rm -rf $R
