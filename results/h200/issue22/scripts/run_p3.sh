# issue #22: the tma forward's persistent grid with three consumer warpgroups as the default of a plain forward's short
# items in 192-row tiles (plan.fast.with_wide_persistent, N_k <= 2048) on an H200: GPU tests (the persistent, documents,
# tma and fast-path files) beside memcheck, racecheck and synccheck of san_wide_persistent.py; then bench --documents 8
# at d 64 (io-dense, Flex) and the dense d 64 forward at N 512-4096 beside cuDNN and FLASH (call and graph modes).
# OUT=<dir>, COMMIT=<hash>; lands in $OUT/p3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/p3; G=tests/gpu; S=results/h200/issue22/scripts/san_wide_persistent.py; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
(timeout 260 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE $G/test_persistent.py $G/test_documents.py \
   $G/test_fast_path.py > $R/t1.txt 2>&1; echo "rc $?" >> $R/t1.txt) &
(timeout 260 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE $G/test_tma.py > $R/t2.txt 2>&1; echo "rc $?" >> $R/t2.txt) &
(for tool in memcheck racecheck synccheck; do timeout 80 compute-sanitizer --tool $tool python3 $S > $R/san-$tool.txt 2>&1; echo "rc $?" >> $R/san-$tool.txt; done) &
wait
B="python3 -m iokernels.cli bench --repeats 10 --warmup 2 --dtype float16"
echo "$B --impls torch,dense --mode call --backward --documents 8 --d 64 --N 16384 --heads 16 --peers flex --time-budget 60" >> $R/commands.txt
timeout 90 $B --impls torch,dense --mode call --backward --documents 8 --d 64 --N 16384 --heads 16 --peers flex --time-budget 60 > $R/bench-documents.txt 2> $R/bench-documents.err; echo "rc $?" >> $R/bench-documents.txt
echo "$B --impls torch --mode both --d 64 --N 512,1024,2048,4096 --peers flash,cudnn --time-budget 60" >> $R/commands.txt
timeout 90 $B --impls torch --mode both --d 64 --N 512,1024,2048,4096 --peers flash,cudnn --time-budget 60 > $R/bench-d64.txt 2> $R/bench-d64.err; echo "rc $?" >> $R/bench-d64.txt
for f in $R/t1.txt $R/t2.txt $R/san-*.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | tail -4; done
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d    N/,$p' $f | grep -v "^  io-torch" | head -40; done
tar czf $OUT/p3.tgz -C $OUT p3 && rm -rf $R
