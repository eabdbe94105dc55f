# issue #21: iok_flush's barriers as barrier.sync (not .aligned) against racecheck's report (b1-b6). racecheck on
# san_band.py's counting launches, six runs with the package's flush (three with bands, three without) and four with
# flush_warp.py's trial flush (no shared memory, no barrier); memcheck and synccheck once; meanwhile the GPU tests of
# every kernel source with a counter flush (counters against the model). OUT=<dir>, COMMIT=<hash>; from the repository
# root. Lands in $OUT/b7.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b7; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 520 python3 -m pytest -q --tb=short -p no:cacheprovider -m 'not slow'"
t() { name=$1; shift; (eval "$T $*" > $L/t-$name.log 2>&1; echo "rc $?" >> $L/t-$name.log) & }
t kernels-decode -n 3 tests/gpu/test_kernels.py tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py
t tma -n 3 tests/gpu/test_tma.py tests/gpu/test_varlen.py
t causal -n 3 tests/gpu/test_causal.py
t mods-tc -n 3 tests/gpu/test_mods.py tests/gpu/test_flash_tc.py tests/gpu/test_flash_tc_bwd.py tests/gpu/test_edge.py
t sparse-mask -n 2 tests/gpu/test_sparse.py tests/gpu/test_mask.py tests/gpu/test_dropout.py tests/gpu/test_standard_masks.py
export SAN_COUNTING_ONLY=1
for i in 1 2 3; do
  SAN_BANDS=2,3,6 timeout 150 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-bands-$i.txt 2>&1
  SAN_BANDS=none SAN_REPEAT=3 timeout 150 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-none-$i.txt 2>&1
done
for i in 1 2; do
  SAN_BANDS=2,3,6 timeout 150 compute-sanitizer --tool racecheck python3 $S/flush_warp.py $S/san_band.py > $L/racecheck-warpflush-bands-$i.txt 2>&1
  SAN_BANDS=none SAN_REPEAT=3 timeout 150 compute-sanitizer --tool racecheck python3 $S/flush_warp.py $S/san_band.py > $L/racecheck-warpflush-none-$i.txt 2>&1
done
unset SAN_COUNTING_ONLY
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool python3 $S/san_band.py > $L/$tool.txt 2>&1
done
wait
for f in $L/*; do echo "== $f"; grep -aE "SUMMARY|^ran|Race reported|^FAILED|passed|failed|^rc" $f | head -6; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b7.tgz -C $OUT b7 && rm -rf $R
