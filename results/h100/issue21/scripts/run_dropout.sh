export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
(timeout 300 python3 -m pytest -q --tb=short tests/gpu/test_dropout.py > $R/t-dropout.log 2>&1; echo "rc $?" >> $R/t-dropout.log) &
(timeout 300 python3 -m pytest -q --tb=short tests/gpu/test_dropout_fast.py tests/gpu/test_library_dropout.py > $R/t-dropout-fast.log 2>&1; echo "rc $?" >> $R/t-dropout-fast.log) &
(timeout 300 python3 -m pytest -q --tb=short tests/gpu/test_flash_tc_bwd.py -k "wide or tma" > $R/t-wide.log 2>&1; echo "rc $?" >> $R/t-wide.log) &
wait
for f in $R/t-*.log; do echo "== $f"; grep -E "^FAILED|^ERROR" $f | head -20; tail -2 $f; done
timeout 230 python3 -m iokernels.cli bench --mode call --dropout 0.1 --backward --peers flash,cudnn --impls torch --repeats 10 --warmup 2 --d 64,128 --N 4096 --dtype float16 --time-budget 200 > $R/bench-dropout.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-dropout.txt | head -40
