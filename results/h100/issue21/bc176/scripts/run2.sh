# issue #21 / #23, second device call of 2026-11-27: the B_c 176 probe (all cases), the backward's per-thread ring
# arrivals against per-warp ones (timing), then in parallel the GPU tests of the edited kernels and plans and the four
# sanitizers on the varlen launches (racecheck on all of them). OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; P=results/h100/issue21/bc176/scripts; S=results/h100/issue23/varlen/scripts; L=$R/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version())" >> $R/env.txt 2>&1
echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
timeout 200 python3 $P/bc_probe.py > $R/bc-probe.txt 2>&1; echo "rc $?" >> $R/bc-probe.txt
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r iokernels results /tmp/alt/
python3 - <<'PY'
p = "/tmp/alt/iokernels/kernels/flash_tma_bwd.cu"
s = open(p).read()
a = s.count("iok_mbar_init(&empty[st], CONSUMERS);"); b = s.count("            iok_mbar_arrive(&empty[buf]);")
s = s.replace("iok_mbar_init(&empty[st], CONSUMERS);", "iok_mbar_init(&empty[st], CONSUMERS / 32);")
s = s.replace("            iok_mbar_arrive(&empty[buf]);", "            __syncwarp();\n            if (lane == 0) iok_mbar_arrive(&empty[buf]);")
open(p, "w").write(s); print("per-warp copy", a, b)
PY
(echo "per thread (tree)"; timeout 100 python3 $P/arrive_ab.py; echo "per warp (/tmp/alt)"; cd /tmp/alt && PYTHONPATH=/tmp/alt timeout 100 python3 $P/arrive_ab.py) > $R/arrive-ab.txt 2>&1
cat $R/bc-probe.txt $R/arrive-ab.txt
T="timeout 330 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_varlen.py tests/gpu/test_varlen_torch.py tests/gpu/test_flash_tc_bwd.py -k "varlen or tma" > $L/t-bwd-varlen.log 2>&1; echo "rc $?" >> $L/t-bwd-varlen.log) &
($T tests/gpu/test_flash_tc.py tests/gpu/test_library_window.py tests/gpu/test_fast_path.py tests/gpu/test_torch_op.py tests/gpu/test_window.py > $L/t-fwd.log 2>&1; echo "rc $?" >> $L/t-fwd.log) &
(for tool in memcheck synccheck initcheck; do timeout 100 compute-sanitizer --tool $tool python3 $S/san_varlen.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(timeout 330 compute-sanitizer --tool racecheck python3 $S/san_varlen.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $R/logs.tgz -C $R logs && rm -rf $L
