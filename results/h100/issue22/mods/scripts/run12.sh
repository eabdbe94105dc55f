# issue #22: synccheck (and initcheck) on san_mods.py after the last kernel edit (7866558, float16 captures; run m11
# ran memcheck and racecheck). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/m12.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m12; S=results/h100/issue22/mods/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
python3 $S/san_mods.py > $L/san_mods-plain.txt 2>&1
for tool in synccheck initcheck; do timeout 150 compute-sanitizer --tool $tool python3 $S/san_mods.py > $L/san_mods-$tool.txt 2>&1; echo "rc $?" >> $L/san_mods-$tool.txt; done
for f in $L/*; do echo "== $f"; grep -aE "ERROR SUMMARY|^ran" $f | head -4; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/m12.tgz -C $OUT m12 && rm -rf $R
