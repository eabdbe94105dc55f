# issue #22, after the review (fastpath.prepared shared by the fast path and the mods; the captures' checks in one
# place; captured inputs by name in make_device_inputs and compare): the mods' GPU tests, the library and torch fast
# paths that prepare_fast serves (library, varlen, decode, torch), and compare on the GPU with a captured document
# table. No kernel code changed (a comment in common.cuh). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands
# in $OUT/m14.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m14; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 330 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log) &
($T tests/gpu/test_library.py tests/gpu/test_varlen_torch.py tests/gpu/test_torch_kvcache.py > $L/t-fast.log 2>&1; echo "rc $?" >> $L/t-fast.log) &
wait
C="python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 2 --heads 8 --backward --repeats 3"
echo "$C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096" > $R/commands.txt
timeout 120 $C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096 > $R/compare-docs.txt 2>&1; echo "rc $?" >> $R/compare-docs.txt
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
grep -E " total |rc " $R/compare-docs.txt >> $R/checks.txt
cat $R/checks.txt
tar czf $OUT/m14.tgz -C $OUT m14 && rm -rf $R
