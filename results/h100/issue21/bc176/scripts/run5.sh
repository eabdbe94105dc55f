# issue #21, after the causal blocks' longest-first order (flash_tma.cu, flash_tma_bwd.cu): the A/B of the order (plan
# alone, graph replays), then the GPU tests of the tma kernels and the four sanitizers on san_today.py's launches, then
# the causal bench again. OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; P=results/h100/issue21/bc176/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r iokernels results /tmp/alt/ && python3 $P/old_order.py > $R/causal-ab.txt
(echo "longest first (tree)"; timeout 100 python3 $P/causal_ab.py; echo "each head in turn (/tmp/alt)"; cd /tmp/alt && PYTHONPATH=/tmp/alt timeout 100 python3 $P/causal_ab.py; cd - > /dev/null; echo "longest first (tree) again"; timeout 100 python3 $P/causal_ab.py) >> $R/causal-ab.txt 2>&1
cat $R/causal-ab.txt
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_causal.py tests/gpu/test_flash_tc_bwd.py tests/gpu/test_window.py > $L/t-causal-bwd.log 2>&1; echo "rc $?" >> $L/t-causal-bwd.log) &
($T tests/gpu/test_flash_tc.py tests/gpu/test_dropout_fast.py tests/gpu/test_persistent.py tests/gpu/test_varlen.py > $L/t-fwd.log 2>&1; echo "rc $?" >> $L/t-fwd.log) &
(python3 $P/san_today.py > /dev/null 2>&1; for tool in memcheck racecheck synccheck initcheck; do timeout 120 compute-sanitizer --tool $tool python3 $P/san_today.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
timeout 120 python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2 --mode both --peers flash,cudnn --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 100 > $R/bench-causal.txt 2> $R/bench-causal.err
sed -n '/^B\*H\*N/,/^ratios/p' $R/bench-causal.txt; sed -n '/^over the main table/,$p' $R/bench-causal.txt
