# issue #23: the whole decode bench at the session's code (the host cuts of 2ff6d7a in): `iokernels bench --decode
# --mode both` (d 128, fp16, one token, 64:8 and 8:8, B 1-64, N_k 4k-128k, ours beside SDPA FLASH / CUDNN / EFFICIENT
# and its own choice). OUT=<dir>, COMMIT=<hash>; lands in $OUT/d14.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d14; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
echo "python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230" > $R/commands.txt
timeout 270 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230 > $R/decode.json 2> $R/decode-progress.txt
echo "bench rc $?" >> $R/env.txt
python3 -c "import json; from iokernels.bench import decode; print(decode.render(json.load(open('$R/decode.json'))))" > $R/decode.txt 2>&1
grep -A8 -iE "criteria, over" $R/decode.txt | head -12
tar czf $OUT/d14.tgz -C $OUT d14 && rm -rf $R
