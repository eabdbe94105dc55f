# issue #22: the persistent block-sparse forward (a list per item, written by the producer's warp 1): its GPU tests
# and the regressions of the forward, the sanitizers, then `iokernels bench --block-sparse 0.25` without causal (the
# plans that changed). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b3; S=results/h100/issue22/block_sparse/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_block_sparse_fast.py tests/gpu/test_alibi.py > $L/t-new.log 2>&1; echo "rc $?" >> $L/t-new.log) &
($T tests/gpu/test_tma.py tests/gpu/test_softcap.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
(python3 $S/san_sparse.py > $L/san-plain.txt 2>&1; for tool in memcheck racecheck synccheck; do timeout 90 compute-sanitizer --tool $tool python3 $S/san_sparse.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B=(python3 -m iokernels.cli bench --block-sparse 0.25 --backward --mode both --N 16384 --heads 16 --d 64,128 --dtype float16 --peers flex --repeats 10 --warmup 2)
echo "${B[@]} --time-budget 110" >> $R/commands.txt
timeout 130 "${B[@]}" --time-budget 110 > $R/bench-sparse.txt 2> $R/bench-sparse.err; echo "rc $?" >> $R/bench-sparse.txt
sed -n '/^d    N      dtype    pass/,/^$/p' $R/bench-sparse.txt; sed -n '/^d    N      dtype    B/,/^$/p' $R/bench-sparse.txt
tar czf $OUT/b3.tgz -C $OUT b3 && rm -rf $R
