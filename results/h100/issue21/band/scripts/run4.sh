# issue #21: after iok_flush's __syncwarp (kernels/common.cuh): racecheck on san_band.py three times and on
# race_probe.py (d 64 fp16, bands 2 and 3) twice, the other three tools once on san_band.py; the GPU tests of the
# causal tma grids (test_causal, test_tma) and the counting builds' checks (test_kernels). OUT=<dir>, COMMIT=<hash>;
# from the repository root. Lands in $OUT/b4.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b4; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 4 tests/gpu/test_causal.py tests/gpu/test_tma.py > $L/t-causal-tma.log 2>&1; echo "rc $?" >> $L/t-causal-tma.log) &
($T -n 2 tests/gpu/test_kernels.py tests/gpu/test_decode.py > $L/t-kernels.log 2>&1; echo "rc $?" >> $L/t-kernels.log) &
(python3 $S/san_band.py > $L/san-plain.txt 2>&1
 for i in 1 2 3; do timeout 120 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/san-racecheck-$i.txt 2>&1; echo "rc $?" >> $L/san-racecheck-$i.txt; done
 for i in 1 2; do RACE_D=64 RACE_DTYPE=float16 RACE_BANDS=2,3 SRC_OUT=/tmp timeout 100 compute-sanitizer --tool racecheck python3 $S/race_probe.py > $L/probe-racecheck-$i.txt 2>&1; echo "rc $?" >> $L/probe-racecheck-$i.txt; done
 for tool in memcheck synccheck initcheck; do timeout 120 compute-sanitizer --tool $tool python3 $S/san_band.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b4.tgz -C $OUT b4 && rm -rf $R
