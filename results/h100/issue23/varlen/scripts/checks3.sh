# issue #23, variable-length batches, third pass: tiles_probe.py (B_r 128 against 192 at d 64, the GPU alone), then
# the sanitizers on the varlen launches, each launch printed as it completes: memcheck and synccheck on every case,
# then racecheck on the quick cases. OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT, the tree's commit (the device's .git is stale)}
R=$OUT; S=results/h100/issue23/varlen/scripts; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt; echo "commit $COMMIT" >> $R/env.txt
timeout 150 python3 $S/tiles_probe.py > $R/tiles-probe.txt 2>&1; echo "rc $?" >> $R/tiles-probe.txt
(timeout 200 compute-sanitizer --tool memcheck python3 $S/san_varlen.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
(timeout 200 compute-sanitizer --tool synccheck python3 $S/san_varlen.py > $R/san-synccheck.txt 2>&1; echo "rc $?" >> $R/san-synccheck.txt) &
wait
timeout 180 compute-sanitizer --tool racecheck python3 $S/san_varlen.py --quick > $R/san-racecheck-quick.txt 2>&1; echo "rc $?" >> $R/san-racecheck-quick.txt
cat $R/tiles-probe.txt; for f in $R/san-*; do echo "== $f"; grep -aE "ERROR SUMMARY|RACECHECK SUMMARY|^ran" $f; tail -2 $f; grep -c " s  " $f; done
