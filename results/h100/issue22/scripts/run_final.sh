# issue #22 / #21, the session's last device call, after the last kernel edit: GPU tests of the forward (persistent),
# the window and the library's window, memcheck and a forward racecheck of the window builds, the bench (window 1024
# vs FlexAttention, fwd and bwd; dense fwd and bwd vs cuDNN and FA2 at N 16384), a backward probe. COMMIT=<h> OUT=<dir>
export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
S=results/h100/issue22/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
(timeout 200 python3 -m pytest -q --tb=short tests/gpu/test_window.py tests/gpu/test_tma.py > $R/t-window-tma.log 2>&1; echo "rc $?" >> $R/t-window-tma.log) &
(timeout 200 python3 -m pytest -q --tb=short tests/gpu/test_library_window.py tests/gpu/test_torch_op.py tests/gpu/test_dropout_fast.py -k "forward or window or Window or torch" > $R/t-lib.log 2>&1; echo "rc $?" >> $R/t-lib.log) &
(timeout 200 python3 -m pytest -q --tb=short tests/gpu/test_causal.py tests/gpu/test_fast_path.py -k "fast and fwd or fast_path" > $R/t-causal-fast.log 2>&1; echo "rc $?" >> $R/t-causal-fast.log) &
(timeout 200 compute-sanitizer --tool memcheck python3 $S/san_window.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
(SAN_QUICK=1 SAN_DIRS=fwd timeout 200 compute-sanitizer --tool racecheck python3 $S/san_window.py > $R/san-racecheck-fwd.txt 2>&1; echo "rc $?" >> $R/san-racecheck-fwd.txt) &
wait
for f in $R/t-*.log $R/san-*.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran" $f | head -8; tail -2 $f; done
timeout 150 python3 -m iokernels.cli bench --mode call --window 1024,0 --d 64,128 --N 16384 --dtype float16 --backward --peers flex --impls torch --repeats 10 --warmup 2 --max-call-ms 20000 --time-budget 140 > $R/bench-window.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-window.txt | head -24
timeout 110 python3 -m iokernels.cli bench --mode call --d 64,128 --N 16384 --dtype float16 --backward --peers cudnn,flash --impls torch --repeats 10 --warmup 2 --time-budget 100 > $R/bench-dense.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-dense.txt | head -16
timeout 60 python3 $S/probe_bwd_blocks.py > $R/probe-bwd.txt 2>&1; echo "rc $?" >> $R/probe-bwd.txt
cat $R/probe-bwd.txt
