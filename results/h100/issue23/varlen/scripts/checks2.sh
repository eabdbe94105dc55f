# issue #23, variable-length batches, second pass: the torch front end's GPU tests, test_fast_path.py alone (one of
# its tests failed in checks.sh's run, with three test groups and two sanitizers sharing the GPU), then the
# sanitizers on every varlen launch with the GPU to themselves (checks.sh's memcheck, racecheck and synccheck ran out
# of time there). OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT, the tree's commit (the device's .git is stale)}
R=$OUT; S=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit ${COMMIT:-}" >> $R/env.txt
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
$T tests/gpu/test_varlen_torch.py tests/gpu/test_fast_path.py > $L/t-torch-fastpath.log 2>&1; echo "rc $?" >> $L/t-torch-fastpath.log
(timeout 170 compute-sanitizer --tool memcheck python3 $S/san_varlen.py > $L/san-memcheck.txt 2>&1; echo "rc $?" >> $L/san-memcheck.txt) &
(timeout 170 compute-sanitizer --tool synccheck python3 $S/san_varlen.py > $L/san-synccheck.txt 2>&1; echo "rc $?" >> $L/san-synccheck.txt) &
wait
timeout 180 compute-sanitizer --tool racecheck python3 $S/san_varlen.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
