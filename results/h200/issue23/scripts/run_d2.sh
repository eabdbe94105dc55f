# issue #23 (and #21's probe): on an H200, the decode bench with the split count bounded by HBM's rate (HBM_SMS),
# the decode GPU tests, and #21's non-causal backward list probe. OUT=<dir>, COMMIT=<hash>; lands in $OUT/d2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d2; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
echo "python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230" > $R/commands.txt
timeout 200 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230 > $R/decode.json 2> $R/decode.err
echo "bench rc $?" >> $R/env.txt
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode.py > $R/gpu-tests.txt 2>&1; echo "rc $?" >> $R/gpu-tests.txt
timeout 150 python3 results/h200/issue21/scripts/list_probe_dense_bwd.py > $R/list-probe-dense-bwd.txt 2>&1; echo "rc $?" >> $R/list-probe-dense-bwd.txt
grep -A8 -iE "criteria, over" $R/decode.txt | head -12; tail -3 $R/gpu-tests.txt; cat $R/list-probe-dense-bwd.txt
tar czf $OUT/d2.tgz -C $OUT d2 && rm -rf $R
