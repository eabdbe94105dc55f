# issue #22, MOD_TMA (an explicit mask's tiles loaded by the copy engine with K's): the A/B probe against MOD_STAGE
# (cp.async) and cuDNN, the GPU tests of the explicit masks and the mods and the tma forward's other builds, memcheck /
# racecheck / synccheck / initcheck on the explicit masks, then bench --attn-mask additive and bool.
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/e14.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e14; S=results/h100/issue22/explicit/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())") > $R/env.txt
echo "python3 $S/probe_tma.py" > $R/commands.txt
timeout 150 python3 $S/probe_tma.py > $R/probe-tma.txt 2>&1; echo "rc $?" >> $R/probe-tma.txt
cat $R/probe-tma.txt
T="timeout 230 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 4 tests/gpu/test_explicit_fast.py -k "not torch" > $L/t-explicit.log 2>&1; echo "rc $?" >> $L/t-explicit.log) &
($T tests/gpu/test_explicit_fast.py -k "torch" > $L/t-explicit-torch.log 2>&1; echo "rc $?" >> $L/t-explicit-torch.log) &
($T -n 2 tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log) &
($T -n 3 tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_block_sparse_fast.py -k "not torch" > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
(for tool in memcheck racecheck synccheck initcheck; do timeout 58 compute-sanitizer --tool $tool python3 $S/san_explicit.py > $L/san-explicit-$tool.txt 2>&1; echo "rc $?" >> $L/san-explicit-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B="python3 -m iokernels.cli bench --d 64,128 --N 4096 --dtype float16 --mode both --impls torch"
echo "$B --attn-mask additive --peers cudnn,flex --time-budget 70" >> $R/commands.txt
echo "$B --attn-mask bool --peers cudnn --time-budget 35" >> $R/commands.txt
timeout 100 $B --attn-mask additive --peers cudnn,flex --time-budget 70 > $R/bench-additive.txt 2> $R/bench-additive.err; echo "rc $?" >> $R/bench-additive.txt
timeout 60 $B --attn-mask bool --peers cudnn --time-budget 35 > $R/bench-bool.txt 2> $R/bench-bool.err; echo "rc $?" >> $R/bench-bool.txt
grep -B2 -A12 "^ratios" $R/bench-additive.txt; grep -A12 "^ratios" $R/bench-bool.txt
tar czf $OUT/e14.tgz -C $OUT e14 && rm -rf $R
