# issue #23: GPU regressions of what the decode's routing and the raw-launch changes touch (edge cases, failures, the
# docs' examples, determinism, the library's window and dropout, every kernel's counters, the bench's peers, long
# sequences), after the last kernel edit. OUT=<dir>, COMMIT=<hash>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
T="timeout 330 python3 -m pytest -q --tb=short"
($T tests/gpu/test_edge.py tests/gpu/test_failures.py > $L/t-edge.log 2>&1; echo "rc $?" >> $L/t-edge.log) &
($T tests/gpu/test_apidoc_examples.py tests/gpu/test_determinism.py tests/gpu/test_long_sequence.py tests/gpu/test_peerbench.py > $L/t-docs.log 2>&1; echo "rc $?" >> $L/t-docs.log) &
($T tests/gpu/test_library_window.py tests/gpu/test_library_dropout.py > $L/t-libvariants.log 2>&1; echo "rc $?" >> $L/t-libvariants.log) &
($T tests/gpu/test_kernels.py > $L/t-kernels.log 2>&1; echo "rc $?" >> $L/t-kernels.log) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
