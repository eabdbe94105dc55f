# issue #22: the built-in torch operator takes block_mask= and alibi_slopes= (torch.compile traces them): the GPU tests
# of ALiBi (with the compiled call), block-sparse, the torch front end and the mods (their operators share the block
# mask's conversion). No kernel source changed since 94abfb2. OUT=<dir>, COMMIT=<hash>; from the repository root.
# Lands in $OUT/m10.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m10; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
T="timeout 400 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py > $L/t-alibi-sparse.log 2>&1; echo "rc $?" >> $L/t-alibi-sparse.log) &
($T tests/gpu/test_torch.py tests/gpu/test_mods.py > $L/t-torch-mods.log 2>&1; echo "rc $?" >> $L/t-torch-mods.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/m10.tgz -C $OUT m10 && rm -rf $R
