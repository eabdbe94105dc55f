# issue #23, second device call: the decode GPU tests (dense, cache, paged, library) and regressions of flash_tma.cu,
# memcheck / racecheck / synccheck of the decode kernels, then bench --decode (call and graph). OUT=<dir>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; S=results/h100/issue23/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
git rev-parse HEAD >> $R/env.txt 2>/dev/null; echo "commit ${COMMIT:-}" >> $R/env.txt
(timeout 240 python3 -m pytest -q --tb=short tests/gpu/test_decode.py > $R/t-decode.log 2>&1; echo "rc $?" >> $R/t-decode.log) &
(timeout 240 python3 -m pytest -q --tb=short tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_timing.py > $R/t-tma.log 2>&1; echo "rc $?" >> $R/t-tma.log) &
(timeout 240 python3 -m pytest -q --tb=short tests/gpu/test_window.py tests/gpu/test_dropout_fast.py -k "forward or fwd" > $R/t-window.log 2>&1; echo "rc $?" >> $R/t-window.log) &
(timeout 240 compute-sanitizer --tool memcheck python3 $S/san_decode.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
(timeout 240 compute-sanitizer --tool racecheck python3 $S/san_decode.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt) &
(timeout 240 compute-sanitizer --tool synccheck python3 $S/san_decode.py > $R/san-synccheck.txt 2>&1; echo "rc $?" >> $R/san-synccheck.txt) &
wait
for f in $R/t-*.log $R/san-*.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done
timeout 330 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 300 > $R/decode.json 2> $R/decode-progress.txt
echo "bench rc $?"
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
cat $R/decode.txt | head -80
