# issue #23: the decode GPU tests and the sanitizers again after the inputs fix (no kernel change since run4.sh).
# OUT=<dir>, COMMIT=<hash>
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
echo "commit ${COMMIT:-}" >> $R/env.txt; date -u >> $R/env.txt
(timeout 280 python3 -m pytest -q --tb=short tests/gpu/test_decode.py tests/gpu/test_torch_kvcache.py > $L/t-decode.log 2>&1; echo "rc $?" >> $L/t-decode.log) &
(for tool in memcheck racecheck; do timeout 200 compute-sanitizer --tool $tool python3 $S/san_decode.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(timeout 250 compute-sanitizer --tool synccheck python3 $S/san_decode.py > $L/san-synccheck.txt 2>&1; echo "rc $?" >> $L/san-synccheck.txt; timeout 150 compute-sanitizer --tool initcheck python3 $S/san_decode.py > $L/san-initcheck.txt 2>&1; echo "rc $?" >> $L/san-initcheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
