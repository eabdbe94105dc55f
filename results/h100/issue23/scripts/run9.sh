# issue #23: the decode's packed tile of 64 rows (one consumer warpgroup, plan/decode.py DECODE_BLOCK_R_SMALL) against
# 128. First, on a quiet GPU: decode_probe.py (graph replays, ours beside FLASH and CUDNN) with B_r 64 and with B_r
# 128 (DECODE_BLOCK_R_SMALL set to 128 in the process), alternating, twice each; on an H200 the decode bench; then the
# decode GPU tests and the sanitizers on every decode launch. OUT=<dir>, COMMIT=<hash>; lands in $OUT/d9.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d9; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
C="1,64,8,16384 1,64,8,131072 4,64,8,32768 16,16,16,65536 8,64,8,16384"
br128="import runpy, sys; import iokernels.plan.decode as d; d.DECODE_BLOCK_R_SMALL = 128; sys.argv = ['$S/decode_probe.py', *'$C'.split()]; runpy.run_path('$S/decode_probe.py', run_name='__main__')"
for i in 1 2; do
  timeout 80 python3 $S/decode_probe.py $C > $L/probe-br64-$i.txt 2>&1
  timeout 80 python3 -c "$br128" > $L/probe-br128-$i.txt 2>&1
done
if grep -q H200 $R/env.txt; then
  timeout 240 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 200 > $L/bench-decode.txt 2> $L/bench-decode.err
fi
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
(for tool in memcheck racecheck; do timeout 100 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(for tool in synccheck initcheck; do timeout 100 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^rc" $f | head -8; done > $R/checks.txt
cat $R/checks.txt; for f in $L/probe-*; do echo "== $f"; cat $f; done
tar czf $OUT/d9.tgz -C $OUT d9 && rm -rf $R
