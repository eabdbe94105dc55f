# issue #23, variable-length batches: bench --varlen (64 sequences of lengths uniform in 1..8192, 16 heads; ours and
# the peers in one process, call and graph modes, forward and backward), d 128 and 64, causal and not.
# OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT, the tree's commit (the device's .git is stale)}
R=$OUT; mkdir -p $R
B="python3 -m iokernels.cli bench --varlen --varlen-batch 64 --varlen-max 8192 --heads 16 --dtype float16 --mode both --repeats 10 --warmup 2"
timeout 250 $B --d 128,64 --time-budget 230 --json > $R/bench-varlen.json 2> $R/bench-varlen.err
timeout 250 $B --d 128,64 --causal --time-budget 230 --json > $R/bench-varlen-causal.json 2> $R/bench-varlen-causal.err
for f in $R/bench-varlen*.json; do python3 -c "import json,sys; from iokernels.bench import varlen; print(varlen.render(json.load(open(sys.argv[1]))))" $f > ${f%.json}.txt; cat ${f%.json}.txt; done
