# issue #21, branch next/mio: the public table (run_full.sh), then the backward GPU test files that m1's two shards did
# not reach before their limit (three shards, pytest -v). OUT=<dir>, COMMIT=<hash>; lands in $OUT/full.tgz, $OUT/m2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
OUT=$OUT COMMIT=$COMMIT bash results/h100/issue21/scripts/run_full.sh
R=$OUT/m2; G=tests/gpu; mkdir -p $R
T="timeout 250 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE"
($T $G/test_causal.py $G/test_window.py > $R/t3.txt 2>&1; echo "rc $?" >> $R/t3.txt) &
(sleep 5; $T $G/test_softcap.py $G/test_alibi.py > $R/t4.txt 2>&1; echo "rc $?" >> $R/t4.txt) &
(sleep 10; $T $G/test_dropout_fast.py $G/test_varlen.py $G/test_documents.py > $R/t5.txt 2>&1; echo "rc $?" >> $R/t5.txt) &
wait
for f in $R/t*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR" $f | head; tail -2 $f; done
tar czf $OUT/m2.tgz -C $OUT m2 && rm -rf $R
