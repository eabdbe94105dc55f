# issue #22 on an H200: the bars' cases (sliding window 1024, 8 documents, block-sparse 25 % at N 16384, fwd and bwd, d
# 64 and 128) with ours, the dense fast path on the same shapes (io-dense) and FlexAttention compiled in one bench run
# each, the public torch calls in call mode; the window's and documents' TFLOP/s on their computed tiles against
# io-dense in the same run (bench's "on the computed tiles" table). OUT=<dir>, COMMIT=<hash>; lands in $OUT/t2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/t2; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
B="python3 -m iokernels.cli bench --impls torch,dense --repeats 10 --warmup 2 --dtype float16"
run() { name=$1; limit=$2; shift 2; echo "$B $*" >> $R/commands.txt; timeout $limit $B "$@" > $R/bench-$name.txt 2> $R/bench-$name.err; echo "rc $?" >> $R/bench-$name.txt; }
run window 170 --mode call --backward --window 1024,0 --d 64,128 --N 16384 --heads 16 --peers flex --max-call-ms 20000 --time-budget 140
run documents 150 --mode call --backward --documents 8 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 120
run block-sparse 150 --mode call --backward --block-sparse 0.25 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 120
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^ratios/,$p' $f | grep -v "^  io-torch" | head -40; done
tar czf $OUT/t2.tgz -C $OUT t2 && rm -rf $R
