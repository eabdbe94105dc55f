# issue #22 programmable variants, fifth run (no kernel source changed since df10a26, run m4): the GPU tests of
# tests/gpu/test_mods.py, the torch test alone in a fresh process too (m4's import of torch failed inside pytest), the
# regressions of the kernels whose shared code the variants touched (softcap, ALiBi, block-sparse, tma), the sanitizers
# on san_mods.py, compare on the GPU with a captured document table (m4's failed in compare's input copy, fixed), and
# the speed probe again. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/m5.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m5; S=results/h100/issue22/mods/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
T="timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log;
 $T tests/gpu/test_mods.py -k torch > $L/t-mods-torch.log 2>&1; echo "rc $?" >> $L/t-mods-torch.log) &
($T tests/gpu/test_softcap.py tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py tests/gpu/test_tma.py > $L/t-regress.log 2>&1; echo "rc $?" >> $L/t-regress.log) &
(python3 $S/san_mods.py > $L/san_mods-plain.txt 2>&1;
 for tool in memcheck synccheck racecheck; do timeout 120 compute-sanitizer --tool $tool python3 $S/san_mods.py > $L/san_mods-$tool.txt 2>&1; echo "rc $?" >> $L/san_mods-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
C="python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 2 --heads 8 --backward --repeats 3"
echo "$C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096" > $R/commands.txt
timeout 120 $C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096 > $R/compare-docs.txt 2>&1; echo "rc $?" >> $R/compare-docs.txt
grep -E " total |rc " $R/compare-docs.txt
echo "python3 $S/probe_mods.py" >> $R/commands.txt
timeout 250 python3 $S/probe_mods.py > $R/probe.txt 2> $R/probe.err; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt; tail -3 $R/probe.err
tar czf $OUT/m5.tgz -C $OUT m5 && rm -rf $R
