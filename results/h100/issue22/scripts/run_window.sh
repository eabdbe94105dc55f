# issue #22, first device call for the sliding window: GPU tests, regressions of the kernels it touched,
# sanitizers, a plan-level probe. COMMIT=<hash> OUT=<dir> bash results/h100/issue22/scripts/run_window.sh
export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
S=results/h100/issue22/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
(timeout 420 python3 -m pytest -q --tb=short tests/gpu/test_window.py > $R/t-window.log 2>&1; echo "rc $?" >> $R/t-window.log) &
(timeout 420 python3 -m pytest -q --tb=short tests/gpu/test_tma.py tests/gpu/test_dropout_fast.py tests/gpu/test_causal.py -k "fast or tma or Dropout or dropout" > $R/t-regress.log 2>&1; echo "rc $?" >> $R/t-regress.log) &
(timeout 300 compute-sanitizer --tool memcheck python3 $S/san_window.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
wait
(SAN_QUICK=1 timeout 100 compute-sanitizer --tool racecheck python3 $S/san_window.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt) &
(timeout 100 python3 $S/probe_window.py > $R/probe.txt 2>&1; echo "rc $?" >> $R/probe.txt) &
wait
for f in $R/t-*.log $R/san-*.txt $R/probe.txt; do echo "== $f"; grep -E "^FAILED|^ERROR|ERROR SUMMARY|^ran|TFLOP" $f | head -40; tail -2 $f; done
