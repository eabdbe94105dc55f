# issue #21/#22/#23: the checks after the kernel edits af70574 and d789b04 (the tma backward's counting and VARLEN
# builds keep dK from flying past the step; VARLEN_HEAD_MAJOR addressing): san_bwd.py (dense tma backward) and the
# packed varlen launches (issue23 san_varlen.py) under memcheck, racecheck, synccheck; the window, dropout and tma GPU
# tests. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/r3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/r3; S=results/h100/issue21/bwdpipe/scripts; V=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 250 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_window.py tests/gpu/test_dropout_fast.py > $L/t-window-dropout.log 2>&1; echo "rc $?" >> $L/t-window-dropout.log) &
($T tests/gpu/test_tma.py tests/gpu/test_library_window.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
(python3 $S/san_bwd.py > /dev/null 2>&1; for tool in memcheck synccheck; do timeout 60 compute-sanitizer --tool $tool python3 $S/san_bwd.py > $L/san-bwd-$tool.txt 2>&1; echo "rc $?" >> $L/san-bwd-$tool.txt; done; timeout 120 compute-sanitizer --tool racecheck python3 $S/san_bwd.py > $L/san-bwd-racecheck.txt 2>&1; echo "rc $?" >> $L/san-bwd-racecheck.txt) &
(sleep 10; python3 $V/san_varlen.py --quick > /dev/null 2>&1; for tool in memcheck racecheck; do timeout 150 compute-sanitizer --tool $tool python3 $V/san_varlen.py > $L/san-varlen-$tool.txt 2>&1; echo "rc $?" >> $L/san-varlen-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/r3.tgz -C $OUT r3 && rm -rf $R
