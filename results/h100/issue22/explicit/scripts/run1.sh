# issue #22, explicit masks on the tma kernels (iokernels/library/explicit.py; no kernel source changed): the GPU
# tests of the route and of the masked calls that ran on the research kernels before (torch capture, operators,
# library), memcheck and racecheck on san_explicit.py, then bench --attn-mask additive and bool against SDPA (CUDNN,
# EFFICIENT, FLASH) and FlexAttention, call and graph modes. OUT=<dir>, COMMIT=<hash>; from the repository root.
# Lands in $OUT/e1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e1; S=results/h100/issue22/explicit/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())") > $R/env.txt
T="timeout 260 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 4 tests/gpu/test_explicit_fast.py > $L/t-explicit.log 2>&1; echo "rc $?" >> $L/t-explicit.log) &
($T tests/gpu/test_fast_path.py tests/gpu/test_torch_op.py > $L/t-torch.log 2>&1; echo "rc $?" >> $L/t-torch.log) &
($T tests/gpu/test_library.py -k "mask" > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
(for tool in memcheck racecheck; do timeout 200 compute-sanitizer --tool $tool python3 $S/san_explicit.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
B="python3 -m iokernels.cli bench --d 64,128 --N 4096 --dtype float16 --mode both --impls torch"
echo "$B --attn-mask additive --peers cudnn,efficient,flash,flex --time-budget 150" > $R/commands.txt
echo "$B --attn-mask bool --peers cudnn,efficient,flash --time-budget 70" >> $R/commands.txt
timeout 200 $B --attn-mask additive --peers cudnn,efficient,flash,flex --time-budget 150 > $R/bench-additive.txt 2> $R/bench-additive.err; echo "rc $?" >> $R/bench-additive.txt
timeout 100 $B --attn-mask bool --peers cudnn,efficient,flash --time-budget 70 > $R/bench-bool.txt 2> $R/bench-bool.err; echo "rc $?" >> $R/bench-bool.txt
cat $R/bench-additive.txt $R/bench-bool.txt; tail -3 $R/bench-additive.err $R/bench-bool.err
tar czf $OUT/e1.tgz -C $OUT e1 && rm -rf $R
