# issue #22: `iokernels bench --alibi` (N 4096, B 4, H 16, fp16, d 64 and 128, causal and not, forward and backward,
# call and graph mode; ours through iokernels.torch, FlexAttention compiled with an ALiBi score_mod) and `compare
# --alibi` on the GPU (meas/pred). No kernel changed since a1 (ca49abe). OUT=<dir>, COMMIT=<hash>; from the repository
# root. Lands in $OUT/a2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/a2; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
B=(python3 -m iokernels.cli bench --alibi --backward --mode both --N 4096 --heads 16 --tokens 262144 --d 64,128 --dtype float16 --impls torch --peers flex --repeats 10 --warmup 2)
run() { local out=$1; shift; echo "${B[@]} $*" >> $R/commands.txt; timeout $LIMIT "${B[@]}" "$@" > $R/$out.txt 2> $R/$out.err; echo "rc $?" >> $R/$out.txt; }
LIMIT=150 run bench-alibi --time-budget 130
LIMIT=150 run bench-alibi-causal --causal --time-budget 130
echo "python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 1 --heads 16 --sram 227KB --alibi --causal --backward" >> $R/commands.txt
timeout 90 python3 -m iokernels.cli compare --N 4096 --d 64 --dtype float16 --batch 1 --heads 16 --sram 227KB --alibi --causal --backward > $R/compare.txt 2>&1; echo "rc $?" >> $R/compare.txt
grep -E "^flash +fast|rc " $R/compare.txt | head -10
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d    N      dtype    pass/,/^$/p' $f | head -14; tail -2 $f; done
tar czf $OUT/a2.tgz -C $OUT a2 && rm -rf $R
