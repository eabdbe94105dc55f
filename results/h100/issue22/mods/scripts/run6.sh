# issue #22 programmable variants, sixth run: the block mask of a mask_mod built on the GPU (kernels/mod_blocks.cu):
# the GPU tests of tests/gpu/test_mods.py (the torch test alone in a fresh process too), the sanitizers on
# san_mods.py (now with mod_blocks.cu's launches), compare on the GPU with a captured document table, and the block
# mask probe (GPU against CPU). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/m6.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m6; S=results/h100/issue22/mods/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
T="timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log;
 $T tests/gpu/test_mods.py -k torch > $L/t-mods-torch.log 2>&1; echo "rc $?" >> $L/t-mods-torch.log) &
(python3 $S/san_mods.py > $L/san_mods-plain.txt 2>&1;
 for tool in memcheck synccheck racecheck; do timeout 120 compute-sanitizer --tool $tool python3 $S/san_mods.py > $L/san_mods-$tool.txt 2>&1; echo "rc $?" >> $L/san_mods-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
C="python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 2 --heads 8 --backward --repeats 3"
echo "$C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096" > $R/commands.txt
timeout 120 $C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096 > $R/compare-docs.txt 2>&1; echo "rc $?" >> $R/compare-docs.txt
grep -E " total |rc " $R/compare-docs.txt
echo "python3 $S/probe_blocks.py" >> $R/commands.txt
timeout 150 python3 $S/probe_blocks.py > $R/probe-blocks.txt 2> $R/probe-blocks.err; echo "rc $?" >> $R/probe-blocks.txt
cat $R/probe-blocks.txt; tail -3 $R/probe-blocks.err
tar czf $OUT/m6.tgz -C $OUT m6 && rm -rf $R
