# issue #22: the sliding window's backward on the persistent list grid (ITEM_LIST with WINDOW), on an H200: the plan
# level A/B against a block per item and the dense backward (window_list_probe.py), the window GPU tests of the
# backward (the list's new test included), memcheck and racecheck on san_window_list.py. OUT=<dir>, COMMIT=<hash>;
# lands in $OUT/w1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/w1; S=results/h200/issue22/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 80 python3 $S/window_list_probe.py > $R/probe.txt 2>&1; echo "rc $?" >> $R/probe.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_window.py -k "backward" > $R/gpu-tests.txt 2>&1
echo "rc $?" >> $R/gpu-tests.txt
timeout 50 compute-sanitizer --tool memcheck python3 $S/san_window_list.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt
timeout 60 compute-sanitizer --tool racecheck python3 $S/san_window_list.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt
cat $R/probe.txt; tail -4 $R/gpu-tests.txt; tail -3 $R/san-memcheck.txt $R/san-racecheck.txt
tar czf $OUT/w1.tgz -C $OUT w1 && rm -rf $R
