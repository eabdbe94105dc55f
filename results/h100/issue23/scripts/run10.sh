# issue #23: on an H200 only (else it records the card and stops): decode_probe.py with the packed tile of 64 rows and
# of 128 (DECODE_BLOCK_R_SMALL set to 128 in the process), alternating, twice each, then the decode bench.
# OUT=<dir>, COMMIT=<hash>; lands in $OUT/d10.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d10; S=results/h100/issue23/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
if grep -q H200 $R/env.txt; then
  C="1,64,8,16384 1,64,8,131072 4,64,8,32768 16,16,16,65536 8,64,8,16384"
  br128="import runpy, sys; import iokernels.plan.decode as d; d.DECODE_BLOCK_R_SMALL = 128; sys.argv = ['$S/decode_probe.py', *'$C'.split()]; runpy.run_path('$S/decode_probe.py', run_name='__main__')"
  for i in 1 2; do
    timeout 80 python3 $S/decode_probe.py $C > $L/probe-br64-$i.txt 2>&1
    timeout 80 python3 -c "$br128" > $L/probe-br128-$i.txt 2>&1
  done
  echo "python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230" > $R/commands.txt
  timeout 280 python3 -m iokernels.cli bench --decode --mode both --json --time-budget 230 > $R/decode.txt 2> $R/decode.err
  for f in $L/probe-*; do echo "== $f"; cat $f; done
  tail -25 $R/decode.txt
fi
cat $R/env.txt
tar czf $OUT/d10.tgz -C $OUT d10 && rm -rf $R
