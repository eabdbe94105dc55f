# issue #22: the softcap after iok_tanh took the approximate ex2 and rcp: GPU tests, sanitizers, the probe.
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/s2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/s2; S=results/h100/issue22/softcap/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_softcap.py > $L/t-softcap.log 2>&1; echo "rc $?" >> $L/t-softcap.log) &
(python3 $S/san_softcap.py > /dev/null 2>&1; for tool in memcheck; do timeout 60 compute-sanitizer --tool $tool python3 $S/san_softcap.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done; timeout 90 compute-sanitizer --tool racecheck python3 $S/san_softcap.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
timeout 150 python3 $S/probe_softcap.py > $R/probe.txt 2> $R/probe.err; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt
tar czf $OUT/s2.tgz -C $OUT s2 && rm -rf $R
