# issue #22 programmable variants, fourth run (after the multiplication by 1 / τ and plain capture loads; with compare on the GPU): the GPU tests of tests/gpu/test_mods.py (with the torch front end), the
# sanitizers on san_mods.py, then the speed probe (probe_mods.py: ours with the mods, our built-ins, FlexAttention
# compiled with the same mods). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/m4.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m4; S=results/h100/issue22/mods/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
T="timeout 250 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log) &
(python3 $S/san_mods.py > $L/san_mods-plain.txt 2>&1;
 for tool in memcheck synccheck racecheck; do timeout 120 compute-sanitizer --tool $tool python3 $S/san_mods.py > $L/san_mods-$tool.txt 2>&1; echo "rc $?" >> $L/san_mods-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
C="python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 2 --heads 8 --backward --repeats 3"
echo "$C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096" > $R/commands.txt
timeout 120 $C --mask-mod 'doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx' --doc-table 1000,2000,1096 > $R/compare-docs.txt 2>&1; echo "rc $?" >> $R/compare-docs.txt
echo "$C --score-mod '30.0f * tanhf(score * (1.0f / 30.0f))' --causal" >> $R/commands.txt
timeout 120 $C --score-mod '30.0f * tanhf(score * (1.0f / 30.0f))' --causal > $R/compare-softcap.txt 2>&1; echo "rc $?" >> $R/compare-softcap.txt
grep -E "total|rc " $R/compare-*.txt
echo "python3 $S/probe_mods.py" >> $R/commands.txt
timeout 280 python3 $S/probe_mods.py > $R/probe.txt 2> $R/probe.err; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt; tail -5 $R/probe.err
tar czf $OUT/m4.tgz -C $OUT m4 && rm -rf $R
