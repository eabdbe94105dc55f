export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
(timeout 200 python3 -m pytest -q --tb=short tests/gpu/test_tma.py tests/gpu/test_dropout_fast.py > $R/t-final.log 2>&1; echo "rc $?" >> $R/t-final.log) &
(timeout 200 python3 -m pytest -q --tb=short tests/gpu/test_peerbench.py > $R/t-peerbench.log 2>&1; echo "rc $?" >> $R/t-peerbench.log) &
(SAN_DS=256,136 SAN_QUICK=1 timeout 200 compute-sanitizer --tool memcheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
wait
for f in $R/t-*.log $R/san-*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR|ERROR SUMMARY|^ran" $f | head; tail -2 $f; done
timeout 150 python3 -m iokernels.cli bench --mode call --causal --d 128 --N 65536 --heads 4 --dtype float16 --backward --peers flash,cudnn --impls torch --repeats 5 --warmup 1 --max-call-ms 5000 --time-budget 120 > $R/bench-causal-65536.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-causal-65536.txt | head -16
