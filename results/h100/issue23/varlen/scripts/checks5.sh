# issue #23, after the fix of the backward's counting-build register hand-back (BAR_REGS): the GPU tests of the
# tma backward (varlen and dense) and of the varlen front ends, beside the four sanitizers on every varlen launch.
# OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; S=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit $COMMIT" >> $R/env.txt
python3 $S/san_varlen.py --quick > /dev/null 2>&1  # compile the quick cases' kernels outside the sanitizers
(timeout 270 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_varlen.py tests/gpu/test_varlen_torch.py tests/gpu/test_flash_tc_bwd.py -k "varlen or tma" > $L/t-bwd-varlen.log 2>&1; echo "rc $?" >> $L/t-bwd-varlen.log) &
(for tool in memcheck synccheck initcheck; do timeout 90 compute-sanitizer --tool $tool python3 $S/san_varlen.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(timeout 270 compute-sanitizer --tool racecheck python3 $S/san_varlen.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
