# issue #23, third device call (after the last kernel edit): the decode GPU tests and regressions of flash_tma.cu and
# the library (raw launches, tensor-map cache, PDL), memcheck / racecheck / synccheck of the decode kernels, the PDL
# probe, bench --decode (call and graph). OUT=<dir>, COMMIT=<hash>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
(timeout 270 python3 -m pytest -q --tb=short tests/gpu/test_decode.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
(timeout 270 python3 -m pytest -q --tb=short tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_timing.py tests/gpu/test_fast_path.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
(timeout 270 python3 -m pytest -q --tb=short tests/gpu/test_window.py tests/gpu/test_dropout_fast.py tests/gpu/test_torch_op.py -k "forward or fwd or torch" > $L/t-window.log 2>&1; echo "rc $?" >> $L/t-window.log) &
(timeout 270 compute-sanitizer --tool memcheck python3 $S/san_decode.py > $L/san-memcheck.txt 2>&1; echo "rc $?" >> $L/san-memcheck.txt) &
(timeout 270 compute-sanitizer --tool racecheck python3 $S/san_decode.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
(timeout 270 compute-sanitizer --tool synccheck python3 $S/san_decode.py > $L/san-synccheck.txt 2>&1; echo "rc $?" >> $L/san-synccheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
timeout 60 python3 $S/pdl_probe.py > $R/pdl.txt 2>&1; cat $R/pdl.txt
timeout 300 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 280 > $R/decode.json 2> $R/decode-progress.txt
echo "bench rc $?"
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
grep -A3 -iE "criteria|criterion" $R/decode.txt | head -20
