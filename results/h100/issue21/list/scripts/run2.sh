# ITEM_LIST in the narrow tma backward: the A/B probe, the sanitizers on san_list.py's backward plans (counters ==
# model), the GPU tests of the causal and tma paths. OUT=<dir>, COMMIT=<hash>; lands in $OUT/l2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/l2; S=results/h100/issue21/list/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
cat $R/env.txt
timeout 60 env SAN_DIRECTIONS=bwd python3 $S/san_list.py > $R/plain.txt 2>&1; echo "rc $?" >> $R/plain.txt; tail -3 $R/plain.txt
if grep -q "^ran" $R/plain.txt; then
  timeout 170 python3 $S/list_probe_bwd.py > $R/probe-bwd.txt 2>&1; echo "probe rc $?" >> $R/probe-bwd.txt; cat $R/probe-bwd.txt
  for tool in memcheck racecheck synccheck; do
    SAN_DIRECTIONS=bwd timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 $S/san_list.py > $R/san-$tool.txt 2>&1
    echo "rc $?" >> $R/san-$tool.txt; echo "== $tool"; tail -3 $R/san-$tool.txt
  done
  timeout 140 python3 -m pytest -q -n 8 -p no:cacheprovider tests/gpu/test_causal.py tests/gpu/test_tma.py > $R/tests.txt 2>&1; tail -3 $R/tests.txt
fi
tar czf $OUT/l2.tgz -C $OUT l2 && rm -rf $R
