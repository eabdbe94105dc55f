# issue #22: dropout with a block mask and with ALiBi on the tma kernels: GPU tests and sanitizers. OUT=<dir>,
# COMMIT=<hash>; from the repository root. Lands in $OUT/a3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/a3; S=results/h100/issue22/alibi/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 150 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_variants_dropout.py > $L/t-dropout.log 2>&1; echo "rc $?" >> $L/t-dropout.log
for tool in memcheck racecheck; do timeout 60 compute-sanitizer --tool $tool python3 $S/san_dropout.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/a3.tgz -C $OUT a3 && rm -rf $R
