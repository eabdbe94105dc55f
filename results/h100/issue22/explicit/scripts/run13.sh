# issue #22, the routed masked calls' cupy fast path (no kernel change): the host probe again, the explicit-mask GPU
# tests (torch ones in one process), the library's masked tests and the torch / fast-path tests. OUT=<dir>,
# COMMIT=<hash>; from the repository root. Lands in $OUT/e13.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e13; S=results/h100/issue22/explicit/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 $S/host_probe.py" > $R/commands.txt
timeout 120 python3 $S/host_probe.py > $R/host-probe.txt 2>&1; echo "rc $?" >> $R/host-probe.txt
head -3 $R/host-probe.txt
T="timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 3 tests/gpu/test_explicit_fast.py -k "not torch" > $L/t-explicit.log 2>&1; echo "rc $?" >> $L/t-explicit.log) &
($T tests/gpu/test_explicit_fast.py -k "torch" > $L/t-explicit-torch.log 2>&1; echo "rc $?" >> $L/t-explicit-torch.log) &
($T tests/gpu/test_torch_op.py tests/gpu/test_fast_path.py tests/gpu/test_torch.py > $L/t-torch.log 2>&1; echo "rc $?" >> $L/t-torch.log) &
($T tests/gpu/test_library.py tests/gpu/test_library_dropout.py > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/e13.tgz -C $OUT e13 && rm -rf $R
