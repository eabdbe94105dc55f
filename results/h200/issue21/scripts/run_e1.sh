# issue #21: the instruction cuts of 2026-11-28 on an H200: ab_sass.py (plan level, the commit before against this
# tree; AB_BASE holds the commit before's iokernels/ as package iok_base, not committed), then the GPU tests of every
# tensor-core kernel in three parallel shards. OUT=<dir>, COMMIT=<hash>; lands in $OUT/e1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e1; S=results/h200/issue21/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
timeout 230 python3 $S/ab_sass.py > $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt
cat $R/ab.txt
T="timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short"
G=tests/gpu
($T $G/test_tma.py $G/test_fast_path.py $G/test_causal.py $G/test_forced_tiles.py $G/test_edge.py $G/test_persistent.py \
   $G/test_flash_tc.py $G/test_flash_tc_bwd.py > $R/t1.txt 2>&1; echo "rc $?" >> $R/t1.txt) &
($T $G/test_window.py $G/test_softcap.py $G/test_alibi.py $G/test_mods.py $G/test_explicit_fast.py \
   $G/test_block_sparse_fast.py $G/test_dropout_fast.py $G/test_variants_dropout.py > $R/t2.txt 2>&1; echo "rc $?" >> $R/t2.txt) &
($T $G/test_varlen.py $G/test_documents.py $G/test_decode.py $G/test_torch.py $G/test_torch_op.py $G/test_library.py \
   $G/test_long_sequence.py > $R/t3.txt 2>&1; echo "rc $?" >> $R/t3.txt) &
wait
for f in $R/t*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR" $f | head; tail -2 $f; done
tar czf $OUT/e1.tgz -C $OUT e1 && rm -rf $R
