# issue #23: the variable-length forward at d 128 without a mask in 128 x 176 tiles (branch next/varlen176, not merged;
# v2-75c7759/change.diff) on an H200:
# ab_varlen176.py against main's tree (ab_base/iok_base), bench --varlen's forward at d 128 (both modes), then the
# varlen and documents GPU tests beside memcheck of the varlen sanitizer cases (--quick: the d 128 forward in 128 x 176
# among them). OUT=<dir>, COMMIT=<hash>; lands in $OUT/v2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/v2; G=tests/gpu; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
ROUNDS=2 timeout 60 python3 results/h200/issue23/scripts/ab_varlen176.py > $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt
C="python3 -m iokernels.cli bench --varlen --varlen-batch 64 --varlen-max 8192 --heads 16 --d 128 --dtype float16 --mode both --repeats 10 --warmup 2 --time-budget 25"
echo "$C" > $R/commands.txt
timeout 45 $C > $R/bench-varlen.txt 2> $R/bench-varlen.err; echo "rc $?" >> $R/bench-varlen.txt
(timeout 100 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE $G/test_varlen.py $G/test_documents.py \
   $G/test_varlen_torch.py > $R/t.txt 2>&1; echo "rc $?" >> $R/t.txt) &
(timeout 100 compute-sanitizer --tool memcheck python3 results/h100/issue23/varlen/scripts/san_varlen.py --quick \
   > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt) &
wait
cat $R/ab.txt; sed -n '/^pass/,$p' $R/bench-varlen.txt
for f in $R/t.txt $R/san-memcheck.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|^ran" $f | head; tail -2 $f; done
tar czf $OUT/v2.tgz -C $OUT v2 && rm -rf $R
