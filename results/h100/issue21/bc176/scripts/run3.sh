# issue #21, third device call of 2026-11-27: the backward's per-thread ring arrivals against per-warp ones (the main
# stage in graph replays), then `iokernels bench` through the public call (call and graph modes) with B_c 176 the
# default at d 128, beside torch SDPA's FLASH and CUDNN backends and FlexAttention compiled.
# OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; P=results/h100/issue21/bc176/scripts; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/env.txt
python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)" >> $R/env.txt 2>&1
echo "commit $COMMIT" >> $R/env.txt; date -u >> $R/env.txt
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r iokernels results /tmp/alt/
python3 - <<'PY'
p = "/tmp/alt/iokernels/kernels/flash_tma_bwd.cu"
s = open(p).read()
a = s.count("iok_mbar_init(&empty[st], CONSUMERS);"); b = s.count("            iok_mbar_arrive(&empty[buf]);")
s = s.replace("iok_mbar_init(&empty[st], CONSUMERS);", "iok_mbar_init(&empty[st], CONSUMERS / 32);")
s = s.replace("            iok_mbar_arrive(&empty[buf]);", "            __syncwarp();\n            if (lane == 0) iok_mbar_arrive(&empty[buf]);")
open(p, "w").write(s); print("per-warp copy", a, b)
PY
(echo "per thread (tree)"; timeout 120 python3 $P/arrive_ab.py; echo "per warp (/tmp/alt)"; cd /tmp/alt && PYTHONPATH=/tmp/alt timeout 120 python3 $P/arrive_ab.py; echo "per thread (tree) again"; cd - > /dev/null; timeout 120 python3 $P/arrive_ab.py) > $R/arrive-ab.txt 2>&1
cat $R/arrive-ab.txt
B=(python3 -m iokernels.cli bench --mode both --backward --peers flash,cudnn,flex --impls torch --repeats 10 --warmup 2)
echo "${B[@]} --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 330" > $R/commands.txt
timeout 400 "${B[@]}" --d 128,64 --N 4096,16384 --dtype float16,bfloat16 --time-budget 330 > $R/bench-main.txt 2> $R/bench-main.err
echo "rc $?" >> $R/bench-main.txt
cat $R/bench-main.txt
