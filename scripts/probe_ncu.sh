#!/usr/bin/env bash
# One-off probe for issue #4 development: what ncu on the device prints (version, metric names, CSV
# layout for one small plan, with and without cache control). Writes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
export PYTHONPATH=.
{ which ncu; ncu --version; } > "$OUT/ncu-version.txt" 2>&1
ncu --query-metrics --chip gh100 > "$OUT/ncu-query-metrics.txt" 2>&1
M=dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_red.sum,l1tex__m_xbar2l1tex_read_sectors.sum,l1tex__m_l1tex2xbar_write_sectors.sum
PROG="from iokernels import gpu; from iokernels.plan import make_plan
p = make_plan('standard', N_q=1000, d=64, dtype='float16', sram=96*1024)
i, _ = gpu.make_device_inputs(p)
gpu.run_plan(p, i, counting=False)
print(gpu.run_plan(p, i, counting=True).counts)"
for cc in all none; do
  timeout 120 ncu --clock-control none --cache-control $cc --metrics $M --csv --page raw python3 -c "$PROG" > "$OUT/ncu-standard-cc-$cc.csv" 2> "$OUT/ncu-standard-cc-$cc.err"
done
timeout 120 ncu --clock-control none --metrics $M python3 -c "$PROG" > "$OUT/ncu-standard-text.txt" 2>&1
