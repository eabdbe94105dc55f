# issue #23 (and #22's documents): the variable-length forward's persistent grid (branch next/persistent-varlen) on an
# H200: the varlen and documents GPU tests beside memcheck and racecheck of the varlen and documents sanitizer cases,
# then ab_persistent.py (per item / persistent / persistent 128 x 176, plan level), then bench --varlen's forward at d 128
# (both modes). OUT=<dir>, COMMIT=<hash>; lands in $OUT/p1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/p1; G=tests/gpu; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
(timeout 200 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE $G/test_varlen.py $G/test_documents.py \
   $G/test_varlen_torch.py > $R/t.txt 2>&1; echo "rc $?" >> $R/t.txt) &
(timeout 200 compute-sanitizer --tool memcheck python3 results/h100/issue23/varlen/scripts/san_varlen.py --quick \
   > $R/san-memcheck.txt 2>&1; echo "rc $?" >> $R/san-memcheck.txt;
 timeout 150 compute-sanitizer --tool racecheck python3 results/h100/issue22/documents/scripts/san_docs.py \
   > $R/san-racecheck-docs.txt 2>&1; echo "rc $?" >> $R/san-racecheck-docs.txt) &
wait
ROUNDS=2 timeout 150 python3 results/h200/issue23/scripts/ab_persistent.py > $R/ab.txt 2>&1; echo "rc $?" >> $R/ab.txt
C="python3 -m iokernels.cli bench --varlen --varlen-batch 64 --varlen-max 8192 --heads 16 --d 128 --dtype float16 --mode both --repeats 10 --warmup 2 --time-budget 40"
echo "$C" > $R/commands.txt
timeout 80 $C > $R/bench-varlen.txt 2> $R/bench-varlen.err; echo "rc $?" >> $R/bench-varlen.txt
cat $R/ab.txt; sed -n '/^pass/,$p' $R/bench-varlen.txt
for f in $R/t.txt $R/san-memcheck.txt $R/san-racecheck-docs.txt; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran" $f | head; tail -2 $f; done
tar czf $OUT/p1.tgz -C $OUT p1 && rm -rf $R
