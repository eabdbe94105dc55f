# issue #22: the block-sparse forward on the list's persistent grid (ITEM_LIST, balanced by the rows' kept tiles): the
# plan-level A/B against a block per item (list_probe.py), GPU tests (block-sparse, and the tma forward's other builds:
# the producer's item loop changed), sanitizers on san_sparse.py, then `iokernels bench --block-sparse 0.25` forward
# (N 16384, B 1, H 16, fp16, d 64 and 128, causal and not; ours, FlexAttention compiled, our dense path) and compare's
# meas/pred. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b4.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b4; S=results/h100/issue22/block_sparse/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 $S/list_probe.py" > $R/commands.txt
timeout 120 python3 $S/list_probe.py > $R/list-probe.txt 2>&1; echo "rc $?" >> $R/list-probe.txt
cat $R/list-probe.txt
T="timeout 225 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 3 tests/gpu/test_block_sparse_fast.py tests/gpu/test_softcap.py > $L/t-sparse.log 2>&1; echo "rc $?" >> $L/t-sparse.log) &
($T -n 3 tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_decode.py tests/gpu/test_window.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
($T -n 3 tests/gpu/test_causal.py tests/gpu/test_explicit_fast.py tests/gpu/test_varlen.py tests/gpu/test_alibi.py tests/gpu/test_dropout_fast.py -k "item_list or head_bands or (explicit and not torch) or varlen or (alibi and not torch) or (dropout_fast and forward)" > $L/t-more.log 2>&1; echo "rc $?" >> $L/t-more.log) &
(for tool in memcheck racecheck synccheck initcheck; do timeout 55 compute-sanitizer --tool $tool python3 $S/san_sparse.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|^E  " $f | head -12; grep -ac "^ran" $f; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B=(python3 -m iokernels.cli bench --block-sparse 0.25 --mode both --N 16384 --heads 16 --d 64,128 --dtype float16 --peers flex --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=65 run bench-sparse --time-budget 50
LIMIT=65 run bench-sparse-causal --causal --time-budget 50
timeout 45 python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 1 --heads 16 --sram 227KB --block-sparse 0.25 --block-pattern random --causal > $R/compare.txt 2>&1; echo "rc $?" >> $R/compare.txt
grep -E "fast|rc " $R/compare.txt | head -8
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d  /,/^$/p' $f | head -14; tail -3 $f; done
tar czf $OUT/b4.tgz -C $OUT b4 && rm -rf $R
