# issue #23: the decode call's host time piece by piece (host_pieces.py). OUT=<dir>, COMMIT=<hash>; lands in $OUT/d12.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d12; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 120 python3 results/h100/issue23/scripts/host_pieces.py > $R/host-pieces.txt 2>&1; echo "rc $?" >> $R/host-pieces.txt
cat $R/host-pieces.txt
tar czf $OUT/d12.tgz -C $OUT d12 && rm -rf $R
