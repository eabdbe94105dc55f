# issue #21, the stmatrix dQ (73ba7b2): the backward GPU tests m1 and m2 did not reach (their shards ran into the limit
# in test_causal.py's research-kernel cases): the rest of test_causal.py, and test_window.py. OUT=<dir>, COMMIT=<hash>;
# lands in $OUT/m3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m3; G=tests/gpu; mkdir -p $R
T="timeout 280 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE"
($T $G/test_causal.py -k "not test_counters_and_outputs and not test_rows_with_no_visible_key" > $R/t6.txt 2>&1; echo "rc $?" >> $R/t6.txt) &
(sleep 5; $T $G/test_window.py > $R/t7.txt 2>&1; echo "rc $?" >> $R/t7.txt) &
wait
for f in $R/t*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR" $f | head; tail -2 $f; done
tar czf $OUT/m3.tgz -C $OUT m3 && rm -rf $R
