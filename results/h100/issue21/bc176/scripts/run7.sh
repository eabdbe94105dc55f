# issue #21: the tensor-core kernels' exponentials as ex2.approx.ftz (tiles.cuh fast_exp2): A/B against exp2f (a
# patched copy under /tmp/alt), the GPU tests of every tensor-core kernel and sanitizers on san_today.py's launches,
# then the main bench. OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/r7; P=results/h100/issue21/bc176/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r iokernels results /tmp/alt/
for f in flash_tc.cu flash_tc_bwd.cu flash_tma.cu flash_wgmma.cu wg_bwd.cuh; do sed -i 's/fast_exp2(/exp2f(/g' /tmp/alt/iokernels/kernels/$f; done
(echo "fast_exp2 (tree)"; timeout 100 python3 $P/ab_exp2.py; echo "exp2f (/tmp/alt)"; cd /tmp/alt && PYTHONPATH=/tmp/alt timeout 100 python3 $P/ab_exp2.py; cd - > /dev/null; echo "fast_exp2 (tree) again"; timeout 100 python3 $P/ab_exp2.py) > $R/ab-exp2.txt 2>&1
cat $R/ab-exp2.txt
T="timeout 320 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_flash_tc_bwd.py tests/gpu/test_edge.py > $L/t-bwd-edge.log 2>&1; echo "rc $?" >> $L/t-bwd-edge.log) &
($T tests/gpu/test_causal.py tests/gpu/test_window.py tests/gpu/test_dropout_fast.py > $L/t-causal-window-dropout.log 2>&1; echo "rc $?" >> $L/t-causal-window-dropout.log) &
($T tests/gpu/test_flash_tc.py tests/gpu/test_varlen.py tests/gpu/test_decode.py tests/gpu/test_persistent.py > $L/t-fwd.log 2>&1; echo "rc $?" >> $L/t-fwd.log) &
(python3 $P/san_today.py > /dev/null 2>&1; for tool in memcheck racecheck; do timeout 120 compute-sanitizer --tool $tool python3 $P/san_today.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
timeout 140 python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2 --mode both --peers flash,cudnn --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 110 > $R/bench-main.txt 2> $R/bench-main.err
sed -n '/^B\*H\*N/,/^ratios/p' $R/bench-main.txt; sed -n '/^over the main table/,$p' $R/bench-main.txt
tar czf $OUT/r7.tgz -C $OUT r7 && rm -rf $R
