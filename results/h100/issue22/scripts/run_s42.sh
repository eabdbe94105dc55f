# The session's last checks (2026-11-28) after its last kernel edit (2dd41d8; 0755d25's cubins byte-identical): the GPU
# tests run4.sh / run5.sh / run14.sh did not run on those kernels (mods, explicit masks with torch, documents, the kv
# cache, the library and torch front ends, every plan's counters, edge cases), and the sanitizers on the explicit
# masks (MOD_TMA), the causal list plans (forward: SAN_DIRECTIONS=fwd) and the decode launches. OUT=<dir>, COMMIT=<hash>; from the repository root.
# Lands in $OUT/s42.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/s42; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 330 python3 -m pytest -q --tb=short -p no:cacheprovider"
G=tests/gpu
grep -E "^\(\$T|timeout" $0 > $R/commands.txt
($T -n 2 $G/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log) &
($T -n 3 $G/test_explicit_fast.py $G/test_documents.py $G/test_torch_kvcache.py > $L/t-explicit-docs-kv.log 2>&1; echo "rc $?" >> $L/t-explicit-docs-kv.log) &
($T -n 3 $G/test_kernels.py $G/test_library.py $G/test_fast_path.py $G/test_torch.py $G/test_torch_op.py > $L/t-kernels-lib.log 2>&1; echo "rc $?" >> $L/t-kernels-lib.log) &
($T -n 3 $G/test_edge.py $G/test_long_sequence.py > $L/t-edge.log 2>&1; echo "rc $?" >> $L/t-edge.log) &
(for s in results/h100/issue22/explicit/scripts/san_explicit.py results/h100/issue21/list/scripts/san_list.py; do
   n=$(basename $s .py)
   for tool in memcheck racecheck; do SAN_DIRECTIONS=fwd timeout 75 compute-sanitizer --tool $tool python3 $s > $L/$n-$tool.txt 2>&1; echo "rc $?" >> $L/$n-$tool.txt; done
 done
 timeout 90 compute-sanitizer --tool memcheck python3 results/h100/issue23/scripts/san_decode.py > $L/san_decode-memcheck.txt 2>&1; echo "rc $?" >> $L/san_decode-memcheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|^E  " $f | head -12; grep -aE "^ran" $f | tail -1; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/s42.tgz -C $OUT s42 && rm -rf $R
