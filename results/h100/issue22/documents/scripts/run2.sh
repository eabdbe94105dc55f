# issue #22: `iokernels bench --documents 8` (8 documents of 2048 in N 16384, B 1, H 16, fp16, d 64 and 128, causal
# and not) in call and graph mode, ours against FlexAttention compiled, then the dense fast path on the same shapes
# (ours alone; the bar is 0.9x its TFLOP/s). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/d2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d2; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
B=(python3 -m iokernels.cli bench --backward --impls torch --mode both --N 16384 --heads 16 --d 64,128 --dtype float16 --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=130 run bench-documents --peers flex --documents 8 --time-budget 110
LIMIT=130 run bench-documents-causal --peers flex --documents 8 --causal --time-budget 110
LIMIT=80 run bench-dense --peers none --time-budget 60
LIMIT=80 run bench-dense-causal --peers none --causal --time-budget 60
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d  /,/^$/p' $f | head -12; done
tar czf $OUT/d2.tgz -C $OUT d2 && rm -rf $R
