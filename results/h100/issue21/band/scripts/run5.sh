# issue #21: is racecheck's iok_flush hazard (runs b1, b4, r3) the bands'? iok_flush as before (the __syncwarp of
# df6a006 removed: it did not remove the hazard, b4); racecheck on san_band.py without bands (SAN_BANDS=none) and
# with them, alternating, three times each. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b5.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b5; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
SAN_BANDS=none,2,3,6 python3 $S/san_band.py > $L/san-plain.txt 2>&1
for i in 1 2 3; do
  for b in none 2,3,6; do
    SAN_BANDS=$b timeout 100 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-$b-$i.txt 2>&1; echo "rc $?" >> $L/racecheck-$b-$i.txt
  done
done
for f in $L/*; do echo "== $f"; grep -aE "RACECHECK SUMMARY|^ran|Race reported" $f | head -4; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b5.tgz -C $OUT b5 && rm -rf $R
