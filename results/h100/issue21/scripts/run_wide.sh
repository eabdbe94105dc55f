export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
S=results/h100/issue21/scripts/san_tma_bwd.py
timeout 170 python3 -m pytest -q --tb=short -x tests/gpu/test_flash_tc_bwd.py -k wide > $R/tests-wide.log 2>&1; echo "rc $?" >> $R/tests-wide.log
timeout 100 python3 -m pytest -q --tb=short tests/gpu/test_dropout_fast.py -k "256 or 160 or 192" >> $R/tests-wide.log 2>&1; echo "rc $?" >> $R/tests-wide.log
grep -E "passed|failed|rc |Error|assert" $R/tests-wide.log | head -30
timeout 200 python3 -m iokernels.cli bench --mode call --backward --peers flash,cudnn --impls torch --repeats 10 --warmup 2 --d 256,192 --N 4096 --dtype float16,bfloat16 --time-budget 150 > $R/bench-wide.txt 2>&1
cat $R/bench-wide.txt | head -60
SAN_DS=256,136 timeout 120 compute-sanitizer --tool memcheck python3 $S > $R/san.txt 2>&1; tail -3 $R/san.txt
SAN_DS=256 SAN_QUICK=1 timeout 100 compute-sanitizer --tool synccheck python3 $S >> $R/san.txt 2>&1; tail -3 $R/san.txt
SAN_DS=256 SAN_QUICK=1 timeout 150 compute-sanitizer --tool racecheck python3 $S >> $R/san.txt 2>&1; tail -3 $R/san.txt
