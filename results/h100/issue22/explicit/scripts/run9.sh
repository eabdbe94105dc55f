# issue #22, regressions after the explicit-mask route (kernels as at 6ab4909; library, plans and docs at the commit
# given): the library- and torch-facing GPU tests in four groups side by side (torch tests without pytest-xdist).
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/e9.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e9; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())") > $R/env.txt
T="timeout 500 python3 -m pytest -q --tb=short -p no:cacheprovider"
echo "$T tests/gpu/test_library.py tests/gpu/test_library_dropout.py tests/gpu/test_library_window.py" > $R/commands.txt
echo "$T tests/gpu/test_torch_op.py tests/gpu/test_torch.py tests/gpu/test_fast_path.py tests/gpu/test_apidoc_examples.py" >> $R/commands.txt
echo "$T tests/gpu/test_documents.py tests/gpu/test_alibi.py tests/gpu/test_softcap.py tests/gpu/test_block_sparse_fast.py" >> $R/commands.txt
echo "$T tests/gpu/test_mask.py tests/gpu/test_standard_masks.py tests/gpu/test_window.py" >> $R/commands.txt
($T tests/gpu/test_library.py tests/gpu/test_library_dropout.py tests/gpu/test_library_window.py > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
($T tests/gpu/test_torch_op.py tests/gpu/test_torch.py tests/gpu/test_fast_path.py tests/gpu/test_apidoc_examples.py > $L/t-torch.log 2>&1; echo "rc $?" >> $L/t-torch.log) &
($T tests/gpu/test_documents.py tests/gpu/test_alibi.py tests/gpu/test_softcap.py tests/gpu/test_block_sparse_fast.py > $L/t-variants.log 2>&1; echo "rc $?" >> $L/t-variants.log) &
($T tests/gpu/test_mask.py tests/gpu/test_standard_masks.py tests/gpu/test_window.py > $L/t-masks.log 2>&1; echo "rc $?" >> $L/t-masks.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/e9.tgz -C $OUT e9 && rm -rf $R
