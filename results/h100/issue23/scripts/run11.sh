# issue #23: host time of one decode call (host_probe.py: ours beside SDPA FLASH / CUDNN, then cProfile of ours).
# OUT=<dir>, COMMIT=<hash>; lands in $OUT/d11.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d11; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 120 python3 results/h100/issue23/scripts/host_probe.py > $R/host-probe.txt 2>&1
echo "rc $?" >> $R/host-probe.txt
grep "^B" $R/host-probe.txt
tar czf $OUT/d11.tgz -C $OUT d11 && rm -rf $R
