# issue #21: the backward's instruction cuts as kept (ab7c5be's, the forward back to b183ec9's code, TB_LEAN) on an
# H200: first the torch tests that failed in e1 (three shards on one GPU, killed by their limit before any traceback),
# alone; ab_sass.py's backward cases (AB_CASES=bwd); then the GPU tests of the tensor-core kernels in two shards;
# memcheck and racecheck of the tma backward. OUT=<dir>, COMMIT=<hash>; lands in $OUT/e2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/e2; S=results/h200/issue21/scripts; G=tests/gpu; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
P="python3 -m pytest -q -p no:cacheprovider --tb=short -rfE"
timeout 150 $P $G/test_softcap.py::test_library_and_torch $G/test_alibi.py::test_library_and_torch \
  $G/test_mods.py::test_torch_autograd "$G/test_explicit_fast.py::test_torch_attn_mask_with_autograd" \
  $G/test_explicit_fast.py::test_torch_masked_calls_take_the_fast_path $G/test_block_sparse_fast.py::test_library_and_torch \
  > $R/t0.txt 2>&1; echo "rc $?" >> $R/t0.txt; tail -4 $R/t0.txt
AB_CASES=bwd timeout 150 python3 $S/ab_sass.py > $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt; cat $R/ab.txt
T="timeout 240 $P"
($T $G/test_tma.py $G/test_causal.py $G/test_window.py $G/test_softcap.py $G/test_alibi.py > $R/t1.txt 2>&1; echo "rc $?" >> $R/t1.txt) &
($T $G/test_mods.py $G/test_explicit_fast.py $G/test_block_sparse_fast.py $G/test_dropout_fast.py $G/test_varlen.py \
   $G/test_documents.py > $R/t2.txt 2>&1; echo "rc $?" >> $R/t2.txt) &
(SAN_DS=128,64 SAN_QUICK=1 timeout 200 compute-sanitizer --tool memcheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt;
 SAN_DS=128,64 SAN_QUICK=1 timeout 100 compute-sanitizer --tool racecheck python3 results/h100/issue21/scripts/san_tma_bwd.py > $R/san-racecheck.txt 2>&1; echo "rc $?" >> $R/san-racecheck.txt;
 timeout 60 compute-sanitizer --tool racecheck python3 results/h200/issue22/scripts/san_window_list.py > $R/san-racecheck-list.txt 2>&1; echo "rc $?" >> $R/san-racecheck-list.txt) &
wait
for f in $R/t1.txt $R/t2.txt $R/san-*.txt; do echo "== $f"; grep -E "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY" $f | head; tail -2 $f; done
tar czf $OUT/e2.tgz -C $OUT e2 && rm -rf $R
