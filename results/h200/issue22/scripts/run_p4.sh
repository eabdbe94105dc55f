# issue #22: after the 192-row persistent grid became a plain forward's default for short items (main at 19d63b8): the
# GPU test files whose plans take it (edge shapes, the library and torch calls, the kernels, the torch operator) on an
# H200, three processes at once. OUT=<dir>, COMMIT=<hash>; lands in $OUT/p4.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/p4; G=tests/gpu; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 250 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE"
($T $G/test_edge.py $G/test_kernels.py > $R/t1.txt 2>&1; echo "rc $?" >> $R/t1.txt) &
($T $G/test_library.py $G/test_forced_tiles.py > $R/t2.txt 2>&1; echo "rc $?" >> $R/t2.txt) &
($T $G/test_torch.py $G/test_torch_op.py > $R/t3.txt 2>&1; echo "rc $?" >> $R/t3.txt) &
wait
for f in $R/t*.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^rc" $f | tail -5; done
tar czf $OUT/p4.tgz -C $OUT p4 && rm -rf $R
