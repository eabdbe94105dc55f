# issue #23, the device call after the last kernel edit: the GPU tests of the decode (dense, cache, paged, causal,
# append; cupy and torch) and of what the change touched (flash_tma.cu's other builds, the library's plan choice, raw
# launches), the sanitizers on the decode kernels, bench --decode (call and graph). OUT=<dir>, COMMIT=<hash>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
T="timeout 280 python3 -m pytest -q --tb=short"
($T tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
($T tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_fast_path.py tests/gpu/test_timing.py tests/gpu/test_window.py -k "not backward and not bwd" > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
($T tests/gpu/test_library.py tests/gpu/test_torch_op.py tests/gpu/test_torch.py > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
($T tests/gpu/test_causal.py -k "fast or library or torch" > $L/t-causal.log 2>&1; echo "rc $?" >> $L/t-causal.log) &
(for tool in memcheck racecheck synccheck; do timeout 150 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
timeout 280 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 260 > $R/decode.json 2> $R/decode-progress.txt
echo "bench rc $?"
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
grep -A5 -iE "criteria, over" $R/decode.txt | head -8
