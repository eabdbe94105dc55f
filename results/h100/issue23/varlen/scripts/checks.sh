# issue #23, variable-length batches: the GPU tests of the varlen kernels and of the kernels their edits touched
# (flash_tma.cu's other builds, flash_tma_bwd.cu, wg_bwd.cuh's stores), compare --varlen on the GPU (counters against
# the model), and the four sanitizers on every varlen launch of iokernels.analysis.sanitize_cases.
# OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT, the tree's commit (the device's .git is stale)}
R=$OUT; S=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_varlen.py > $L/t-varlen.log 2>&1; echo "rc $?" >> $L/t-varlen.log) &
($T tests/gpu/test_flash_tc_bwd.py -k tma tests/gpu/test_library_window.py > $L/t-bwd.log 2>&1; echo "rc $?" >> $L/t-bwd.log) &
($T tests/gpu/test_flash_tc.py tests/gpu/test_decode.py tests/gpu/test_persistent.py tests/gpu/test_fast_path.py tests/gpu/test_torch_op.py > $L/t-fwd.log 2>&1; echo "rc $?" >> $L/t-fwd.log) &
(for tool in memcheck racecheck; do timeout 240 compute-sanitizer --tool $tool python3 $S/san_varlen.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(for tool in synccheck initcheck; do timeout 240 compute-sanitizer --tool $tool python3 $S/san_varlen.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
timeout 100 python3 $S/doc_example.py > $R/doc-example.txt 2>&1
timeout 200 python3 -m iokernels.cli compare --varlen 1,113,0,239,1023,4097,777,2048 --d 128 --dtype float16 --heads 16 --kv-heads 4 --backward --causal > $R/compare-varlen-causal.txt 2> $L/compare.err
timeout 200 python3 -m iokernels.cli compare --varlen 1,113,0,239,1023,4097,777,2048 --d 64 --dtype bfloat16 --heads 16 --backward > $R/compare-varlen.txt 2>> $L/compare.err
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt; grep -E "total" $R/compare-varlen*.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
