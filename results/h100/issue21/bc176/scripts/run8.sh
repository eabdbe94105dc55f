# issue #21: the backwards' dSᵀ store as stmatrix (wg_bwd.cuh): A/B against 32-bit stores (a patched copy under
# /tmp/alt), then the GPU tests of both sm_90 backwards and racecheck/memcheck on san_today.py's launches.
# OUT=<dir>, COMMIT=<hash>; run from the repository root. Everything lands in $OUT/r8.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/r8; P=results/h100/issue21/bc176/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r iokernels results /tmp/alt/ && cp $P/wg_bwd_sts.cuh /tmp/alt/iokernels/kernels/wg_bwd.cuh
(echo "stmatrix (tree)"; timeout 80 python3 $P/ab_stsm.py; echo "32-bit stores (/tmp/alt)"; cd /tmp/alt && PYTHONPATH=/tmp/alt timeout 80 python3 $P/ab_stsm.py; cd - > /dev/null; echo "stmatrix (tree) again"; timeout 80 python3 $P/ab_stsm.py) > $R/ab-stsm.txt 2>&1
cat $R/ab-stsm.txt
T="timeout 240 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_flash_tc_bwd.py -k "tma or wgmma" > $L/t-bwd.log 2>&1; echo "rc $?" >> $L/t-bwd.log) &
($T tests/gpu/test_varlen.py tests/gpu/test_dropout_fast.py -k "bwd or backward or grad" > $L/t-varlen-dropout.log 2>&1; echo "rc $?" >> $L/t-varlen-dropout.log) &
(python3 $P/san_today.py > /dev/null 2>&1; for tool in memcheck racecheck; do timeout 100 compute-sanitizer --tool $tool python3 $P/san_today.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/r8.tgz -C $OUT r8 && rm -rf $R
