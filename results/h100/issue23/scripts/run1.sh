# issue #23, first device call: the decode GPU tests and regressions of flash_tma.cu, memcheck and racecheck of the
# decode kernels, the decode probe. OUT=<dir>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; S=results/h100/issue23/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
(timeout 300 python3 -m pytest -q --tb=short tests/gpu/test_decode.py > $R/t-decode.log 2>&1; echo "rc $?" >> $R/t-decode.log) &
(timeout 300 python3 -m pytest -q --tb=short -x tests/gpu/test_tma.py tests/gpu/test_persistent.py > $R/t-tma.log 2>&1; echo "rc $?" >> $R/t-tma.log) &
(timeout 250 compute-sanitizer --tool memcheck python3 $S/san_decode.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
wait
(timeout 200 compute-sanitizer --tool racecheck python3 $S/san_decode.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt) &
timeout 200 python3 $S/decode_probe.py > $R/probe.txt 2>&1; echo "rc $?" >> $R/probe.txt
wait
for f in $R/t-*.log $R/san-*.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -2 $f; done
cat $R/probe.txt
