# issue #21 (prepared, not yet run): settle racecheck's iok_flush report of b1-b5. Counting builds only, as many launches
# with bands as without (SAN_REPEAT), racecheck four times each; then the GPU tests that did not run after the bands
# (test_mods, test_explicit_fast, test_dropout_fast; the torch tests without xdist). OUT=<dir>, COMMIT=<hash>; from the
# repository root. Lands in $OUT/b6.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b6; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
export SAN_COUNTING_ONLY=1
SAN_BANDS=none,2,3,6 python3 $S/san_band.py > $L/san-plain.txt 2>&1
for i in 1 2 3 4; do
  SAN_BANDS=none SAN_REPEAT=3 timeout 120 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-none-$i.txt 2>&1
  SAN_BANDS=2,3,6 timeout 120 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-bands-$i.txt 2>&1
done
unset SAN_COUNTING_ONLY
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 3 tests/gpu/test_mods.py tests/gpu/test_dropout_fast.py > $L/t-mods-dropout.log 2>&1; echo "rc $?" >> $L/t-mods-dropout.log) &
($T -n 2 tests/gpu/test_explicit_fast.py -k "not torch" > $L/t-explicit.log 2>&1; echo "rc $?" >> $L/t-explicit.log) &
($T tests/gpu/test_explicit_fast.py -k "torch" > $L/t-explicit-torch.log 2>&1; echo "rc $?" >> $L/t-explicit-torch.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "RACECHECK SUMMARY|^ran|Race reported|^FAILED|passed|failed" $f | head -6; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b6.tgz -C $OUT b6 && rm -rf $R
