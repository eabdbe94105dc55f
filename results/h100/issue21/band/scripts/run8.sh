# issue #21: the barrier-free iok_flush (common.cuh: each warp's lane 0 adds its sums). racecheck on san_band.py's
# counting launches eight times (four with bands, four without), memcheck, synccheck and initcheck once; meanwhile the
# GPU tests of every kernel source (each counting build's flush changed; counters against the model). OUT=<dir>,
# COMMIT=<hash>; from the repository root. Lands in $OUT/b8.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/b8; S=results/h100/issue21/band/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 530 python3 -m pytest -q --tb=short -p no:cacheprovider -m 'not slow'"
t() { name=$1; shift; (eval "$T $*" > $L/t-$name.log 2>&1; echo "rc $?" >> $L/t-$name.log) & }
G=tests/gpu
t kernels-decode -n 3 $G/test_kernels.py $G/test_decode.py $G/test_torch_kvcache.py
t tma -n 2 $G/test_tma.py $G/test_varlen.py $G/test_persistent.py $G/test_determinism.py
t causal -n 3 $G/test_causal.py
t mods-tc -n 3 $G/test_mods.py $G/test_flash_tc.py $G/test_flash_tc_bwd.py $G/test_edge.py
t sparse-mask -n 3 $G/test_sparse.py $G/test_mask.py $G/test_dropout.py $G/test_standard_masks.py $G/test_forced_tiles.py
t variants -n 3 $G/test_block_sparse_fast.py $G/test_dropout_fast.py $G/test_window.py $G/test_alibi.py $G/test_documents.py $G/test_variants_dropout.py $G/test_library_window.py $G/test_library_dropout.py
t explicit -n 2 $G/test_explicit_fast.py $G/test_library.py -k "'not torch'"
t torch $G/test_explicit_fast.py $G/test_torch.py -k torch
export SAN_COUNTING_ONLY=1
for i in 1 2 3 4; do
  SAN_BANDS=2,3,6 timeout 150 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-bands-$i.txt 2>&1
  SAN_BANDS=none SAN_REPEAT=3 timeout 150 compute-sanitizer --tool racecheck python3 $S/san_band.py > $L/racecheck-none-$i.txt 2>&1
done
unset SAN_COUNTING_ONLY
for tool in memcheck synccheck initcheck; do
  timeout 150 compute-sanitizer --tool $tool python3 $S/san_band.py > $L/$tool.txt 2>&1
done
wait
for f in $L/*; do echo "== $f"; grep -aE "SUMMARY|^ran|Race reported|^FAILED|passed|failed|^rc" $f | head -6; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/b8.tgz -C $OUT b8 && rm -rf $R
