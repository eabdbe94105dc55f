# issue #23: on an H200, the decode bench at the split count with a tile pair's cost per block (BLOCK_TILES 1.0), the
# three cases whose split count it changed through decode_probe.py (ours against SDPA FLASH's output, max abs error),
# and the decode GPU tests. OUT=<dir>, COMMIT=<hash>; lands in $OUT/d3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d3; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u;
 python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'triton', triton.__version__)") > $R/env.txt
echo "python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230" > $R/commands.txt
timeout 200 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230 > $R/decode.json 2> $R/decode.err
echo "bench rc $?" >> $R/env.txt
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
echo "python3 results/h100/issue23/scripts/decode_probe.py 1,64,8,131072 4,64,8,131072 16,64,8,131072" >> $R/commands.txt
timeout 90 python3 results/h100/issue23/scripts/decode_probe.py 1,64,8,131072 4,64,8,131072 16,64,8,131072 > $R/probe.txt 2>&1; echo "rc $?" >> $R/probe.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode.py > $R/gpu-tests.txt 2>&1; echo "rc $?" >> $R/gpu-tests.txt
grep -A8 -iE "criteria, over" $R/decode.txt | head -12; cat $R/probe.txt; tail -3 $R/gpu-tests.txt
tar czf $OUT/d3.tgz -C $OUT d3 && rm -rf $R
