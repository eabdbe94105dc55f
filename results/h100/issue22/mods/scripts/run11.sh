# issue #22: float16 captured arrays (read as floats; an explicit additive mask as a score_mod): the GPU tests of
# tests/gpu/test_mods.py (a float16 bias among them), the sanitizers on san_mods.py, and probe_additive.py (ours with
# the mask as a score_mod against SDPA CUDNN with it as attn_mask and FlexAttention). OUT=<dir>, COMMIT=<hash>; from
# the repository root. Lands in $OUT/m11.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m11; S=results/h100/issue22/mods/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
(timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log) &
(python3 $S/san_mods.py > $L/san_mods-plain.txt 2>&1;
 for tool in memcheck racecheck; do timeout 120 compute-sanitizer --tool $tool python3 $S/san_mods.py > $L/san_mods-$tool.txt 2>&1; echo "rc $?" >> $L/san_mods-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
echo "python3 $S/probe_additive.py" > $R/commands.txt
timeout 200 python3 $S/probe_additive.py > $R/probe-additive.txt 2> $R/probe-additive.err; echo "rc $?" >> $R/probe-additive.txt
cat $R/probe-additive.txt; tail -3 $R/probe-additive.err
tar czf $OUT/m11.tgz -C $OUT m11 && rm -rf $R
