# issue #22: ALiBi (ALIBI) and block-sparse (BLOCK_SPARSE) on the tma kernels: the GPU tests (the new ones and the
# regressions: the kernels changed), the sanitizers on both, then a first ALiBi probe. OUT=<dir>, COMMIT=<hash>; from
# the repository root. Lands in $OUT/a1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/a1; S=results/h100/issue22/alibi/scripts; SB=results/h100/issue22/block_sparse/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py > $L/t-new.log 2>&1; echo "rc $?" >> $L/t-new.log;
 $T tests/gpu/test_tma.py tests/gpu/test_window.py tests/gpu/test_torch.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
($T tests/gpu/test_softcap.py tests/gpu/test_documents.py tests/gpu/test_varlen.py tests/gpu/test_dropout_fast.py > $L/t-more.log 2>&1; echo "rc $?" >> $L/t-more.log) &
(for s in $S/san_alibi.py $SB/san_sparse.py; do n=$(basename $s .py); python3 $s > $L/$n-plain.txt 2>&1;
 for tool in memcheck synccheck racecheck; do timeout 100 compute-sanitizer --tool $tool python3 $s > $L/$n-$tool.txt 2>&1; echo "rc $?" >> $L/$n-$tool.txt; done; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
timeout 150 python3 $S/probe_alibi.py > $R/probe.txt 2> $R/probe.err; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt
tar czf $OUT/a1.tgz -C $OUT a1 && rm -rf $R
