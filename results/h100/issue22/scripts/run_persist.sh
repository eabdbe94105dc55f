# issue #22 (window) and #21 (persistent tma forward): GPU tests of the forward and of the library's window, a
# persistent-vs-per-item probe, and the bench: window 1024 vs FlexAttention, dense vs cuDNN. COMMIT=<hash> OUT=<dir>
export PYTHONPATH=. IOKERNELS_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
S=results/h100/issue22/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
(timeout 230 python3 -m pytest -q --tb=short -x tests/gpu/test_window.py tests/gpu/test_tma.py > $R/t-window-tma.log 2>&1; echo "rc $?" >> $R/t-window-tma.log) &
(timeout 230 python3 -m pytest -q --tb=short tests/gpu/test_library_window.py tests/gpu/test_dropout_fast.py -k "forward or window or Window" > $R/t-lib-dropout.log 2>&1; echo "rc $?" >> $R/t-lib-dropout.log) &
(timeout 230 python3 -m pytest -q --tb=short tests/gpu/test_causal.py tests/gpu/test_fast_path.py -k "fast and fwd or fast_path" > $R/t-causal-fast.log 2>&1; echo "rc $?" >> $R/t-causal-fast.log) &
wait
for f in $R/t-*.log; do echo "== $f"; grep -E "^FAILED|^ERROR" $f | head -8; tail -2 $f; done
timeout 60 python3 $S/probe_persist.py > $R/probe-persist.txt 2>&1; echo "rc $?" >> $R/probe-persist.txt
cat $R/probe-persist.txt
timeout 150 python3 -m iokernels.cli bench --mode call --window 1024,0 --d 64,128 --N 16384 --dtype float16 --backward --peers flex --impls torch --repeats 10 --warmup 2 --time-budget 140 > $R/bench-window.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-window.txt | head -20
timeout 80 python3 -m iokernels.cli bench --mode call --d 64,128 --N 16384 --dtype float16 --no-backward --peers cudnn,flash --impls torch --repeats 10 --warmup 2 --time-budget 70 > $R/bench-dense.txt 2>&1
sed -n '/^B\*H\*N/,$p' $R/bench-dense.txt | head -12
