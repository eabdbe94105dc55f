# issue #21: the tma backward's step order (dK after dQ, at B_r 64 waited once the next step's Sᵀ/dPᵀ fly) and dSᵀ by
# stmatrix: A/B of the main stage against `base` (af554d1) and `stsm` (stmatrix only), each in a copy under /tmp/ab,
# alternated; then the sm_90 backward GPU tests and the four sanitizers on san_bwd.py. OUT=<dir>, COMMIT=<hash>; run
# from the repository root. Everything lands in $OUT/r1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/r1; S=results/h100/issue21/bwdpipe/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
K=iokernels/kernels
for v in base stsm; do rm -rf /tmp/ab/$v; mkdir -p /tmp/ab/$v; cp -r iokernels /tmp/ab/$v/; cp $S/base_flash_tma_bwd.cu /tmp/ab/$v/$K/flash_tma_bwd.cu; done
cp $S/base_wg_bwd.cuh /tmp/ab/base/$K/wg_bwd.cuh; cp $S/stsm_wg_bwd.cuh /tmp/ab/stsm/$K/wg_bwd.cuh
for v in new base stsm new base stsm; do if [ $v = new ]; then timeout 70 python3 $S/ab_bwd.py new; else (P=$PWD; cd /tmp/ab/$v && PYTHONPATH=/tmp/ab/$v timeout 70 python3 $P/$S/ab_bwd.py $v); fi; done > $R/ab.txt 2>&1
sort -s -k2,9 $R/ab.txt | grep main
T="timeout 230 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_flash_tc_bwd.py tests/gpu/test_tma.py -k "bwd or backward or grad" > $L/t-bwd.log 2>&1; echo "rc $?" >> $L/t-bwd.log) &
($T tests/gpu/test_window.py tests/gpu/test_dropout_fast.py tests/gpu/test_varlen.py -k "bwd or backward or grad" > $L/t-variants.log 2>&1; echo "rc $?" >> $L/t-variants.log) &
(python3 $S/san_bwd.py > /dev/null 2>&1; for tool in memcheck synccheck initcheck; do timeout 70 compute-sanitizer --tool $tool python3 $S/san_bwd.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(sleep 20; timeout 210 compute-sanitizer --tool racecheck python3 $S/san_bwd.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/r1.tgz -C $OUT r1 && rm -rf $R
