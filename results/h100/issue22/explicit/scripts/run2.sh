# issue #22, after the kernel edits 8c0ad0c (flash_tma_bwd: lse -inf read as +inf) and 9f9dab0 (flash_tma MOD_BIAS):
# the A/B probe of MOD_BIAS, the GPU tests of the explicit masks, the mods and every tma backward family the lse change
# touches, memcheck / racecheck / synccheck on the explicit masks, the mods and the backward's sanitizer launches,
# then bench --attn-mask additive and bool. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/e2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e2; S=results/h100/issue22/explicit/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())") > $R/env.txt
echo "python3 $S/probe_bias.py" > $R/commands.txt
timeout 120 python3 $S/probe_bias.py > $R/probe-bias.txt 2>&1; echo "rc $?" >> $R/probe-bias.txt
cat $R/probe-bias.txt
T="timeout 290 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 4 tests/gpu/test_explicit_fast.py tests/gpu/test_mods.py > $L/t-explicit-mods.log 2>&1; echo "rc $?" >> $L/t-explicit-mods.log) &
($T -n 3 tests/gpu/test_flash_tc_bwd.py tests/gpu/test_tma.py -k "bwd or backward or grad" > $L/t-tma-bwd.log 2>&1; echo "rc $?" >> $L/t-tma-bwd.log) &
($T -n 3 tests/gpu/test_window.py tests/gpu/test_dropout_fast.py tests/gpu/test_softcap.py tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py > $L/t-variants.log 2>&1; echo "rc $?" >> $L/t-variants.log) &
($T -n 2 tests/gpu/test_varlen.py tests/gpu/test_fast_path.py tests/gpu/test_torch_op.py > $L/t-varlen-torch.log 2>&1; echo "rc $?" >> $L/t-varlen-torch.log) &
(for tool in memcheck racecheck synccheck; do timeout 100 compute-sanitizer --tool $tool python3 $S/san_explicit.py > $L/san-explicit-$tool.txt 2>&1; echo "rc $?" >> $L/san-explicit-$tool.txt; done;
 for tool in memcheck racecheck; do timeout 100 compute-sanitizer --tool $tool python3 results/h100/issue21/bwdpipe/scripts/san_bwd.py > $L/san-bwd-$tool.txt 2>&1; echo "rc $?" >> $L/san-bwd-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B="python3 -m iokernels.cli bench --d 64,128 --N 4096 --dtype float16 --mode both --impls torch"
echo "$B --attn-mask additive --peers cudnn,efficient,flash,flex --time-budget 100" >> $R/commands.txt
echo "$B --attn-mask bool --peers cudnn,efficient,flash --time-budget 50" >> $R/commands.txt
timeout 140 $B --attn-mask additive --peers cudnn,efficient,flash,flex --time-budget 100 > $R/bench-additive.txt 2> $R/bench-additive.err; echo "rc $?" >> $R/bench-additive.txt
timeout 80 $B --attn-mask bool --peers cudnn,efficient,flash --time-budget 50 > $R/bench-bool.txt 2> $R/bench-bool.err; echo "rc $?" >> $R/bench-bool.txt
grep -A12 "^ratios" $R/bench-additive.txt; grep -A12 "^ratios" $R/bench-bool.txt
tar czf $OUT/e2.tgz -C $OUT e2 && rm -rf $R
