# issue #21: Nsight Compute's stall reasons (per issued instruction), instructions and issue activity of the d 128
# backward's main kernel, ours beside cuDNN's, causal and dense N 16384 B 1 H 16 (ncu_l2.py with NCU_CASES).
# OUT=<dir>, COMMIT=<hash>; lands in $OUT/n2.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/n2; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u; ncu --version | tail -1) > $R/env.txt
M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
echo "NCU_CASES='1,16,16384,1;1,16,16384,0' ncu --clock-control none --kernel-name regex:\"flash_tma_bwd|bprop\" --metrics $M --csv python3 results/h200/issue21/scripts/ncu_l2.py" > $R/commands.txt
NCU_CASES='1,16,16384,1;1,16,16384,0' timeout 200 ncu --clock-control none --kernel-name regex:"flash_tma_bwd|bprop" \
  --metrics "$M" --csv python3 results/h200/issue21/scripts/ncu_l2.py > $R/ncu.csv 2> $R/ncu.err; echo "rc $?" >> $R/env.txt
grep -v "^==PROF==" $R/ncu.csv | python3 -c "
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
h = rows[0]; k = h.index('Kernel Name'); m = h.index('Metric Name'); v = h.index('Metric Value'); i = h.index('ID')
tab = {}
for r in rows[1:]:
    tab.setdefault(r[m], {})[int(r[i])] = r[v]
ids = sorted({int(r[i]) for r in rows[1:]})
names = {int(r[i]): ('ours' if 'flash_tma' in r[k] else 'cudnn') for r in rows[1:]}
print('metric'.ljust(60), ' '.join(f'{names[x]}{x}'.rjust(12) for x in ids))
for name in sorted(tab):
    print(name.replace('smsp__average_warps_issue_stalled_', 'stall ').replace('_per_issue_active.ratio', '').ljust(60),
          ' '.join(str(tab[name].get(x, '')).rjust(12) for x in ids))
" > $R/summary.txt 2>&1
cat $R/env.txt $R/summary.txt
