# issue #21: the causal tma grids in bands of heads (HEAD_BAND). band_ab.py (alone on the GPU first), then the GPU
# tests of every tma kernel family that runs a causal grid and compute-sanitizer's four tools on san_band.py.
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/b1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b1; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 $S/band_ab.py" > $R/commands.txt
timeout 230 python3 $S/band_ab.py > $R/band-ab.txt 2>&1; echo "rc $?" >> $R/band-ab.txt
cat $R/band-ab.txt
T="timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T -n 4 tests/gpu/test_causal.py tests/gpu/test_tma.py > $L/t-causal-tma.log 2>&1; echo "rc $?" >> $L/t-causal-tma.log) &
($T -n 3 tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py tests/gpu/test_window.py tests/gpu/test_softcap.py > $L/t-variants.log 2>&1; echo "rc $?" >> $L/t-variants.log) &
($T tests/gpu/test_library.py tests/gpu/test_torch.py > $L/t-library.log 2>&1; echo "rc $?" >> $L/t-library.log) &
(python3 $S/san_band.py > $L/san-plain.txt 2>&1; for tool in memcheck racecheck synccheck initcheck; do timeout 200 compute-sanitizer --tool $tool python3 $S/san_band.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -14; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b1.tgz -C $OUT b1 && rm -rf $R
