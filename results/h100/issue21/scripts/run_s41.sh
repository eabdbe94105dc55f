# Session 41's first call: on an H200, issue #21's whole table with shuffled rounds (run_full.sh); on any other card the
# two GPU tests the last session could not run (the band tests' shared helper; the ALiBi torch.compile test alone).
# OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/full.tgz (H200) or $OUT/s41.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"
if echo "$card" | grep -q H200; then
  bash results/h100/issue21/scripts/run_full.sh
else
  R=$OUT/s41; mkdir -p $R
  (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
  echo "python3 -m pytest -q tests/gpu/test_causal.py -k bands -p no:cacheprovider" > $R/commands.txt
  timeout 200 python3 -m pytest -q tests/gpu/test_causal.py -k bands -p no:cacheprovider > $R/bands.log 2>&1
  echo "python3 -m pytest -q tests/gpu/test_alibi.py::test_torch_compile_takes_a_block_mask_and_alibi -p no:cacheprovider" >> $R/commands.txt
  timeout 200 python3 -m pytest -q tests/gpu/test_alibi.py::test_torch_compile_takes_a_block_mask_and_alibi -p no:cacheprovider > $R/alibi.log 2>&1
  tail -3 $R/*.log
  tar czf $OUT/s41.tgz -C $OUT s41 && rm -rf $R
fi
