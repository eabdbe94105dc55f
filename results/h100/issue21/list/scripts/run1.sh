# ITEM_LIST's first device run: the A/B probe, the sanitizers on san_list.py, the GPU tests of the forward's causal
# and persistent paths, and the causal forward bench beside cuDNN, FA2 and FlexAttention. OUT=<dir>, COMMIT=<hash>.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/l1; S=results/h100/issue21/list/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
cat $R/env.txt
timeout 150 python3 $S/list_probe.py > $R/probe.txt 2>&1; echo "probe rc $?" >> $R/probe.txt; cat $R/probe.txt
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $S/san_list.py > $R/san-$tool.txt 2>&1
  echo "rc $?" >> $R/san-$tool.txt; tail -2 $R/san-$tool.txt
done
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/gpu/test_causal.py tests/gpu/test_persistent.py tests/gpu/test_tma.py tests/gpu/test_kernels.py > $R/tests.txt 2>&1; tail -3 $R/tests.txt
echo "python3 -m iokernels.cli bench --impls torch --repeats 10 --warmup 2 --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 100" > $R/commands.txt
timeout 150 python3 -m iokernels.cli bench --impls torch --repeats 10 --warmup 2 --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 100 > $R/bench-causal-fwd.txt 2> $R/bench.err
tail -30 $R/bench-causal-fwd.txt
tar czf $OUT/l1.tgz -C $OUT l1 && rm -rf $R
