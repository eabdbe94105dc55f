# issue #22: fuzzed user expressions on the GPU (tests/gpu/test_mods.py test_fuzzed_expressions: random masks and
# score_mods, forward and backward, against the float64 reference and model.exact) with the rest of test_mods.py. No
# kernel source changed since 7866558 (runs m11, m12). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in
# $OUT/m13.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m13; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 400 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/m13.tgz -C $OUT m13 && rm -rf $R
