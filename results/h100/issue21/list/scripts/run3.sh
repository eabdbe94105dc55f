# The session's last kernel edit (ITEM_LIST in the tma forward and backward): the GPU tests of every kernel source in
# parallel groups (b8's), and meanwhile compute-sanitizer's four tools on san_list.py (forward and backward list plans,
# counters == model). OUT=<dir>, COMMIT=<hash>; lands in $OUT/l4.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/l4; S=results/h100/issue21/list/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 440 python3 -m pytest -q --tb=short -p no:cacheprovider -m 'not slow'"
t() { name=$1; shift; echo "pytest $*" >> $R/commands.txt; (eval "$T $*" > $L/t-$name.log 2>&1; echo "rc $?" >> $L/t-$name.log) & }
G=tests/gpu
t kernels-decode -n 3 $G/test_kernels.py $G/test_decode.py $G/test_torch_kvcache.py
t tma -n 2 $G/test_tma.py $G/test_varlen.py $G/test_persistent.py $G/test_determinism.py
t causal -n 3 $G/test_causal.py
t mods-tc -n 3 $G/test_mods.py $G/test_flash_tc.py $G/test_flash_tc_bwd.py $G/test_edge.py
t sparse-mask -n 3 $G/test_sparse.py $G/test_mask.py $G/test_dropout.py $G/test_standard_masks.py $G/test_forced_tiles.py
t variants -n 3 $G/test_block_sparse_fast.py $G/test_dropout_fast.py $G/test_window.py $G/test_softcap.py $G/test_documents.py $G/test_variants_dropout.py $G/test_library_window.py $G/test_library_dropout.py
t explicit -n 2 $G/test_explicit_fast.py $G/test_library.py $G/test_fast_path.py $G/test_alibi.py $G/test_failures.py -k "'not torch'"
t torch $G/test_explicit_fast.py $G/test_torch.py $G/test_torch_op.py $G/test_fast_path.py -k torch
san() { (timeout 440 compute-sanitizer --tool $1 --error-exitcode 9 python3 $2 > $L/$3.txt 2>&1; echo "rc $?" >> $L/$3.txt) & }
for tool in memcheck racecheck synccheck initcheck; do san $tool $S/san_list.py san-list-$tool; done
wait
for f in $L/*; do echo "== $f"; grep -aE "SUMMARY|^ran|Race reported|^FAILED|passed|failed|^rc" $f | head -6; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/l4.tgz -C $OUT l4 && rm -rf $R
