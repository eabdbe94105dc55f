# issue #22 programmable variants (MASK_MOD / SCORE_MOD / SCORE_GRAD on the tma kernels) and issue #21's snake order of
# the persistent causal forward: the GPU tests (new and regressions: common.cuh's block list and wg_bwd.cuh changed), the
# sanitizers on san_mods.py and the block-sparse launches, an A/B of the causal forward (snake vs round robin, the
# kernel at 9c067a7, alternated), and the causal bench. OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in
# $OUT/m1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/m1; S=results/h100/issue22/mods/scripts; SN=results/h100/issue21/snake/scripts; SB=results/h100/issue22/block_sparse/scripts
L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
T="timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_mods.py > $L/t-mods.log 2>&1; echo "rc $?" >> $L/t-mods.log;
 $T tests/gpu/test_alibi.py tests/gpu/test_block_sparse_fast.py > $L/t-sparse.log 2>&1; echo "rc $?" >> $L/t-sparse.log) &
($T tests/gpu/test_tma.py tests/gpu/test_softcap.py > $L/t-tma.log 2>&1; echo "rc $?" >> $L/t-tma.log) &
(for s in $S/san_mods.py $SB/san_sparse.py; do n=$(basename $s .py); python3 $s > $L/$n-plain.txt 2>&1;
 for tool in memcheck synccheck racecheck; do timeout 100 compute-sanitizer --tool $tool python3 $s > $L/$n-$tool.txt 2>&1; echo "rc $?" >> $L/$n-$tool.txt; done; done) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed|^E  " $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
rm -rf /tmp/ab/base; mkdir -p /tmp/ab/base; cp -r iokernels /tmp/ab/base/; cp $SN/base_flash_tma.cu /tmp/ab/base/iokernels/kernels/flash_tma.cu
for v in snake base snake base; do if [ $v = snake ]; then timeout 80 python3 $SN/ab_fwd.py snake; else (P=$PWD; cd /tmp/ab/base && PYTHONPATH=/tmp/ab/base timeout 80 python3 $P/$SN/ab_fwd.py base); fi; done > $R/ab.txt 2>&1
sort -s -k2,3 $R/ab.txt
B=(python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2)
echo "${B[@]} --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 70" > $R/commands.txt
timeout 100 "${B[@]}" --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16 --time-budget 70 > $R/bench-causal.txt 2> $R/bench-causal.err; echo "rc $?" >> $R/bench-causal.txt
sed -n '/^over the main table/,$p' $R/bench-causal.txt
tar czf $OUT/m1.tgz -C $OUT m1 && rm -rf $R
