# issue #22: run_w1.sh's probe again with its inputs made on the device (window_list_probe.py; run_w1's copy was
# killed building a float64 reference of 16 x 16384^2 on the host). OUT=<dir>, COMMIT=<hash>; lands in $OUT/w2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/w2; S=results/h200/issue22/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 175 python3 $S/window_list_probe.py > $R/probe.txt 2>&1; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt
tar czf $OUT/w2.tgz -C $OUT w2 && rm -rf $R
