# issue #21: the racecheck hazard of run b1 (flash_tma_fwd<bf16>, san_band.py): race_probe.py under racecheck, each
# launch labelled, compiled with -lineinfo; the softcap library/torch test alone (b1 ran it under xdist, where torch's
# custom-op registration fails). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b2; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L $R/src
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
export CUPY_CACHE_DIR=/tmp/lineinfo-cache SRC_OUT=$R/src
python3 $S/race_probe.py > $L/probe-plain.txt 2>&1
timeout 300 compute-sanitizer --tool racecheck --print-limit 40 python3 $S/race_probe.py > $L/probe-racecheck.txt 2>&1; echo "rc $?" >> $L/probe-racecheck.txt &
unset CUPY_CACHE_DIR
(timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_softcap.py > $L/t-softcap.log 2>&1; echo "rc $?" >> $L/t-softcap.log) &
wait
grep -aE "^===|Race|RACECHECK|ERROR SUMMARY|flash_tma.cu:|src-|\.cu:[0-9]" $L/probe-racecheck.txt | head -60
tail -2 $L/t-softcap.log
tar czf $OUT/b2.tgz -C $OUT b2 && rm -rf $R
