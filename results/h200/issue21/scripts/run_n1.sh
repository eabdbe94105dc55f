# issue #21: Nsight Compute's memory and tensor-pipe counters of the d 128 backward's main kernel, ours beside cuDNN's
# (ncu_l2.py: causal N 65,536 B 1 H 4; causal and dense N 16384 B 1 H 16). OUT=<dir>, COMMIT=<hash>; lands in $OUT/n1.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/n1; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u; ncu --version | tail -1) > $R/env.txt
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_red.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
echo "ncu --clock-control none --kernel-name regex:\"flash_tma_bwd|bprop\" --metrics $M --csv python3 results/h200/issue21/scripts/ncu_l2.py" > $R/commands.txt
timeout 250 ncu --clock-control none --kernel-name regex:"flash_tma_bwd|bprop" --metrics $M --csv \
  python3 results/h200/issue21/scripts/ncu_l2.py > $R/ncu.csv 2> $R/ncu.err; echo "rc $?" >> $R/env.txt
grep -v "^==PROF==" $R/ncu.csv | python3 -c "
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
h = rows[0]; k = h.index('Kernel Name'); m = h.index('Metric Name'); v = h.index('Metric Value'); i = h.index('ID')
for r in rows[1:]: print(r[i], r[k][:40], r[m], r[v])
" > $R/summary.txt 2>&1
cat $R/env.txt; cat $R/summary.txt | head -120
