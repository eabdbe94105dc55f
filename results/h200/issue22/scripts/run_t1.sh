# issues #22 and #23 on an H200: the bars' cases measured on the card the issues name (their committed tables are the
# H100's), one run, the public torch call in call mode: sliding window 1024, 8 documents and block-sparse 25 % at N
# 16384 beside FlexAttention compiled (fwd and bwd, d 64 and 128) and the dense fast path on the same shape (the
# variable-length batch: see below). OUT=<dir>, COMMIT=<hash>;
# lands in $OUT/t1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/t1; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
B="python3 -m iokernels.cli bench --impls torch --repeats 10 --warmup 2 --dtype float16"
run() { name=$1; limit=$2; shift 2; echo "$B $*" >> $R/commands.txt; timeout $limit $B "$@" > $R/bench-$name.txt 2> $R/bench-$name.err; echo "rc $?" >> $R/bench-$name.txt; }
run window 150 --mode call --backward --window 1024,0 --d 64,128 --N 16384 --heads 16 --peers flex --max-call-ms 20000 --time-budget 120
run documents 130 --mode call --backward --documents 8 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 100
run block-sparse 130 --mode call --backward --block-sparse 0.25 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 100
run dense 60 --mode call --backward --d 64,128 --N 16384 --heads 16 --peers none --time-budget 40
# (the variable-length batch, refused here for --impls, ran apart: results/h200/issue23/v1-99c0f85/commands.txt)
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^ratios/,/^over/p' $f | head -14; tail -1 $f; done
tar czf $OUT/t1.tgz -C $OUT t1 && rm -rf $R
