# issue #21's whole "done when" table in one run: the public torch call (forward and backward through autograd),
# call and graph modes, ours beside SDPA FLASH (FA2), CUDNN and FlexAttention compiled: d 64 and 128, N 4096 and 16384,
# fp16 and bf16, causal and not; d 32, 96, 256; dropout 0.1; causal N 65,536. OUT=<dir>, COMMIT=<hash>; from the
# repository root. Lands in $OUT/full.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/full; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
B="python3 -m iokernels.cli bench --backward --impls torch --repeats 10 --warmup 2"
run() { name=$1; shift; echo "$B $*" >> $R/commands.txt; timeout 200 $B "$@" > $R/bench-$name.txt 2> $R/bench-$name.err; echo "rc $?" >> $R/bench-$name.txt; }
run main --mode both --peers flash,cudnn,flex --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 125
run causal --mode both --peers flash,cudnn,flex --causal --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 125
run widths --mode both --peers flash,cudnn,flex --d 32,96,256 --N 4096 --dtype float16 --time-budget 65
run dropout --mode call --peers flash,cudnn --dropout 0.1 --d 64,128 --N 4096 --dtype float16 --time-budget 50
run causal-65536 --mode call --peers flash,cudnn --causal --d 128 --N 65536 --heads 4 --dtype float16 --max-call-ms 5000 --time-budget 50
for f in $R/bench-*.txt; do echo "== $f"; tail -1 $f; done
tar czf $OUT/full.tgz -C $OUT full && rm -rf $R
