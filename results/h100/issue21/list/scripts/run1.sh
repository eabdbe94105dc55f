# ITEM_LIST's first device run: the A/B probe, the causal forward bench at N 4096 beside cuDNN, FA2 and FlexAttention,
# the sanitizers on san_list.py, and the GPU tests of the forward's causal and persistent paths. OUT=<dir>, COMMIT=<hash>.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/l1; S=results/h100/issue21/list/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
cat $R/env.txt
timeout 140 python3 $S/list_probe.py > $R/probe.txt 2>&1; echo "probe rc $?" >> $R/probe.txt; cat $R/probe.txt
B="python3 -m iokernels.cli bench --impls torch --repeats 10 --warmup 2 --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096 --dtype float16,bfloat16 --time-budget 70"
echo "$B" > $R/commands.txt
timeout 110 $B > $R/bench-causal-fwd.txt 2> $R/bench.err; echo "rc $?" >> $R/bench-causal-fwd.txt
tail -12 $R/bench-causal-fwd.txt
for tool in memcheck racecheck synccheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 $S/san_list.py > $R/san-$tool.txt 2>&1
  echo "rc $?" >> $R/san-$tool.txt; echo "== $tool"; tail -3 $R/san-$tool.txt
done
timeout 130 python3 -m pytest -q -n 8 -p no:cacheprovider tests/gpu/test_causal.py tests/gpu/test_persistent.py tests/gpu/test_tma.py > $R/tests.txt 2>&1; tail -3 $R/tests.txt
tar czf $OUT/l1.tgz -C $OUT l1 && rm -rf $R
