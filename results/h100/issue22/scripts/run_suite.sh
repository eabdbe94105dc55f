# The whole GPU test suite after the session's last kernel edit (8 pytest groups side by side), then `compare
# --window` on the GPU (counted bytes against the model for the plans whose kernels take the window).
# COMMIT=<hash> OUT=<dir> bash results/h100/issue22/scripts/run_suite.sh
export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
PARTS=tests TEST_GROUPS=8 TEST_LIMIT=${TEST_LIMIT:-420} OUT=$OUT/s PACK=1 bash scripts/gpu_suite.sh > $OUT/suite.log 2>&1
tail -5 $OUT/suite.log
mkdir -p $OUT/r && tar -xzf $OUT/s/suite.tgz -C $OUT/r 2>/dev/null; grep -rhE "passed|failed" $OUT/r --include=*.txt --include=*.log | tail -12
timeout 90 python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --window 1024,0 --backward --batch 1 --heads 16 > $OUT/compare-window.txt 2>&1
grep -E "fast|meas|window" $OUT/compare-window.txt | head -20
