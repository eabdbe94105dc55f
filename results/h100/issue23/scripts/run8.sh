# issue #23, after the review's kernel fixes (the lengths clamped to the capacity, the append's bounds, the register
# split): the decode GPU tests, flash_tma.cu's other builds, the library, the sanitizers on every decode launch.
# OUT=<dir>, COMMIT=<hash>
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:-}
R=$OUT; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
T="timeout 280 python3 -m pytest -q --tb=short"
($T tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
($T tests/gpu/test_tma.py tests/gpu/test_persistent.py tests/gpu/test_fast_path.py tests/gpu/test_library.py tests/gpu/test_torch_op.py > $L/t-tma-library.log 2>&1; echo "rc $?" >> $L/t-tma-library.log) &
(for tool in memcheck racecheck; do timeout 200 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(for tool in synccheck initcheck; do timeout 200 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
