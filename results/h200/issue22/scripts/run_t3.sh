# issue #22 on an H200: documents of one length as the dense path on their batch (iokernels.library.varlen
# uniform_documents): the documents GPU tests, then bench --documents 8 (8 x 2048: the batch) and --documents 7 (6 x
# 2340 + 2344: the variable-length kernels) with io-dense and FlexAttention in one run each, call mode, d 64 and 128,
# fwd and bwd. OUT=<dir>, COMMIT=<hash>; lands in $OUT/t3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/t3; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
(timeout 150 python3 -m pytest -v -p no:cacheprovider --tb=short -rfE tests/gpu/test_documents.py > $R/t.txt 2>&1; echo "rc $?" >> $R/t.txt)
B="python3 -m iokernels.cli bench --impls torch,dense --repeats 10 --warmup 2 --dtype float16"
run() { name=$1; limit=$2; shift 2; echo "$B $*" >> $R/commands.txt; timeout $limit $B "$@" > $R/bench-$name.txt 2> $R/bench-$name.err; echo "rc $?" >> $R/bench-$name.txt; }
run documents8 150 --mode call --backward --documents 8 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 120
run documents7 150 --mode call --backward --documents 7 --d 64,128 --N 16384 --heads 16 --peers flex --time-budget 120
for f in $R/bench-*.txt; do echo "== $f"; sed -n '/^d    N      dtype    B/,/^$/p;/^ratios/,$p' $f | grep -v "^  io-torch" | head -40; done
grep -aE "passed|failed|^FAILED|^ERROR" $R/t.txt | tail -3
tar czf $OUT/t3.tgz -C $OUT t3 && rm -rf $R
