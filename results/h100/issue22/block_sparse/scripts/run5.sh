# issue #22: the block-sparse forward's list (the kernels of 2dd41d8, run4.sh's): the plan-level A/B against a block per
# item (list_probe.py, fixed) and the block-sparse GPU tests (their plan assertions updated, and a test that the list
# changes the order only). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b5.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b5; S=results/h100/issue22/block_sparse/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 $S/list_probe.py" > $R/commands.txt
echo "python3 -m pytest -q -n 3 tests/gpu/test_block_sparse_fast.py" >> $R/commands.txt
timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider -n 3 tests/gpu/test_block_sparse_fast.py > $L/t-sparse.log 2>&1; echo "rc $?" >> $L/t-sparse.log
timeout 200 python3 $S/list_probe.py > $R/list-probe.txt 2>&1; echo "rc $?" >> $R/list-probe.txt
cat $R/list-probe.txt; tail -4 $L/t-sparse.log
tar czf $OUT/b5.tgz -C $OUT b5 && rm -rf $R
