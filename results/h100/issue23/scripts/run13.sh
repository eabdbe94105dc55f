# issue #23: the host time of a fast call before (_before/: 12b3578's iokernels, an untracked copy the device run
# carries) and after (the commit given): host_pieces.py and host_probe.py in alternating processes, twice each; then
# bench --decode at B 1 and 4, N_k 4096 and 16384 (call and graph modes, beside SDPA FLASH and CUDNN); then the GPU
# tests of the fast paths (torch, cupy, decode, kv cache, tma maps). OUT=<dir>, COMMIT=<hash>; lands in $OUT/d13.tgz.
export PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d13; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT (before: 12b3578)"; date -u) > $R/env.txt
for i in 1 2; do
  for side in before after; do
    P=$([ $side = before ] && echo _before || echo .)
    PYTHONPATH=$P timeout 60 python3 $S/host_pieces.py > $L/pieces-$side-$i.txt 2>&1
    PYTHONPATH=$P timeout 60 python3 $S/host_probe.py 1,64,8,4096 1,8,8,16384 4,64,8,16384 2>&1 | grep "^B" > $L/probe-$side-$i.txt
  done
done
for f in $L/pieces-* $L/probe-*; do echo "== $f"; cat $f; done
export PYTHONPATH=.
B="python3 -m iokernels.cli bench --decode --mode both --decode-batch 1,4 --decode-nk 4096,16384 --time-budget 100"
echo "$B" > $R/commands.txt
timeout 140 $B > $R/bench-decode.txt 2> $R/bench-decode.err; echo "rc $?" >> $R/bench-decode.txt
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
G=tests/gpu
($T -n 3 $G/test_fast_path.py $G/test_torch.py $G/test_torch_op.py $G/test_library.py > $L/t-fast.log 2>&1; echo "rc $?" >> $L/t-fast.log) &
($T -n 3 $G/test_decode.py $G/test_torch_kvcache.py $G/test_tma.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
($T -n 2 $G/test_explicit_fast.py $G/test_varlen.py -k "torch or cupy or fast_path" > $L/t-more.log 2>&1; echo "rc $?" >> $L/t-more.log) &
wait
for f in $L/t-*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -10; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt; sed -n '/^ratios/,/^$/p' $R/bench-decode.txt | head -40
tar czf $OUT/d13.tgz -C $OUT d13 && rm -rf $R
