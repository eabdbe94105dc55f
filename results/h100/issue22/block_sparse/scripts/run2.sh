# issue #22 (second run: the softcap with a block mask, the list's loads four at a time): block-sparse attention on the
# tma kernels (BLOCK_SPARSE): GPU tests (the new ones and the tma, window,
# softcap, documents, varlen regressions: the kernels' step loops changed), sanitizers, then `iokernels bench
# --block-sparse 0.25` (N 16384, B 1, H 16, fp16, d 64 and 128, causal and not, forward and backward, call and graph
# mode; ours, FlexAttention compiled, our dense path). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in
# $OUT/b2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b2; S=results/h100/issue22/block_sparse/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 230 python3 -m pytest -q --tb=short -p no:cacheprovider -x"
($T tests/gpu/test_block_sparse_fast.py > $L/t-sparse.log 2>&1; echo "rc $?" >> $L/t-sparse.log;
 $T tests/gpu/test_tma.py tests/gpu/test_window.py tests/gpu/test_torch.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
($T tests/gpu/test_softcap.py tests/gpu/test_documents.py tests/gpu/test_varlen.py tests/gpu/test_dropout_fast.py > $L/t-more.log 2>&1; echo "rc $?" >> $L/t-more.log) &
(python3 $S/san_sparse.py > $L/san-plain.txt 2>&1; for tool in memcheck synccheck; do timeout 80 compute-sanitizer --tool $tool python3 $S/san_sparse.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done; timeout 100 compute-sanitizer --tool racecheck python3 $S/san_sparse.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B=(python3 -m iokernels.cli bench --block-sparse 0.25 --backward --mode both --N 16384 --heads 16 --d 64,128 --dtype float16 --peers flex --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=140 run bench-sparse --time-budget 120
LIMIT=140 run bench-sparse-causal --causal --time-budget 120
timeout 100 python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 1 --heads 16 --sram 227KB --block-sparse 0.25 --block-pattern random --causal --backward > $R/compare.txt 2>&1; echo "rc $?" >> $R/compare.txt
grep -E "fast|rc " $R/compare.txt | head -12
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d  /,/^$/p' $f | head -14; tail -3 $f; done
tar czf $OUT/b2.tgz -C $OUT b2 && rm -rf $R
