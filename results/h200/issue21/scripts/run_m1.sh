# issue #21: the tma backward's dQ tiles by stmatrix into dQacc in pair order (branch next/mio) on an H200: ab_sass.py
# against main's tree (ab_base/iok_base, AB_CASES=bwd and causal), then the GPU tests of the tensor-core backward in
# two shards, memcheck / racecheck / synccheck of the tma backward and racecheck of the list build. OUT=<dir>,
# COMMIT=<hash>; lands in $OUT/m1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m1; S=results/h200/issue21/scripts; G=tests/gpu; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
AB_CASES=bwd timeout 120 python3 $S/ab_sass.py > $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt
AB_CASES=causal timeout 100 python3 $S/ab_sass.py >> $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt; cat $R/ab.txt
P="python3 -m pytest -v -p no:cacheprovider --tb=short -rfE"
T="timeout 260 $P"
($T $G/test_tma.py $G/test_causal.py $G/test_window.py $G/test_softcap.py $G/test_alibi.py > $R/t1.txt 2>&1; echo "rc $?" >> $R/t1.txt) &
($T $G/test_mods.py $G/test_explicit_fast.py $G/test_block_sparse_fast.py $G/test_dropout_fast.py $G/test_varlen.py \
   $G/test_documents.py > $R/t2.txt 2>&1; echo "rc $?" >> $R/t2.txt) &
(SAN_DS=128,64 SAN_QUICK=1 timeout 150 compute-sanitizer --tool memcheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt;
 SAN_DS=128,64 SAN_QUICK=1 timeout 100 compute-sanitizer --tool racecheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt;
 SAN_DS=128 SAN_QUICK=1 timeout 80 compute-sanitizer --tool synccheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-synccheck.txt 2>&1; echo "rc $?" >> $R/san-synccheck.txt;
 timeout 50 compute-sanitizer --tool racecheck python3 results/h200/issue22/scripts/san_window_list.py > $R/san-racecheck-list.txt 2>&1; echo "rc $?" >> $R/san-racecheck-list.txt) &
wait
for f in $R/t1.txt $R/t2.txt $R/san-*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY" $f | head; tail -2 $f; done
tar czf $OUT/m1.tgz -C $OUT m1 && rm -rf $R
