# issue #23: the paged cache against the contiguous one (paged_probe.py), no kernel change since run4.sh. OUT=<dir>
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
echo "commit ${COMMIT:-}" >> $OUT/env.txt; date -u >> $OUT/env.txt
timeout 400 python3 results/h100/issue23/scripts/paged_probe.py 2>&1 | tee $OUT/paged.txt
