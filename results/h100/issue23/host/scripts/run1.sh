# issue #23's decode host time (host_probe.py) and the GPU tests of the review commit d7b9757 (explicit-mask fast
# paths; the torch tests in one process, no xdist). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in
# $OUT/h1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/h1; S=results/h100/issue23/host/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__)") > $R/env.txt
echo "python3 $S/host_probe.py" > $R/commands.txt
timeout 200 python3 $S/host_probe.py > $R/host-probe.txt 2>&1; echo "rc $?" >> $R/host-probe.txt
head -16 $R/host-probe.txt
T="timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 3 tests/gpu/test_explicit_fast.py -k "not torch" > $L/t-explicit.log 2>&1; echo "rc $?" >> $L/t-explicit.log) &
($T tests/gpu/test_explicit_fast.py -k "torch" > $L/t-explicit-torch.log 2>&1; echo "rc $?" >> $L/t-explicit-torch.log) &
($T tests/gpu/test_torch_op.py tests/gpu/test_fast_path.py tests/gpu/test_torch.py > $L/t-torch.log 2>&1; echo "rc $?" >> $L/t-torch.log) &
($T tests/gpu/test_library.py tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/h1.tgz -C $OUT h1 && rm -rf $R
