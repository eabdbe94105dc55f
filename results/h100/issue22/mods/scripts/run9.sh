# issue #22 programmable variants, ninth run (m8: 21 passed, the compiled wrapper failed in dynamo on the block mask's numpy bytes, now outside the trace): the torch front end as custom operators (torch.ops.iokernels.
# attention_mods_fwd / _bwd, traced by torch.compile): tests/gpu/test_mods.py. No kernel source changed since 94abfb2
# (run m6). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/m9.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m9; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
timeout 400 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/m9.tgz -C $OUT m9 && rm -rf $R
