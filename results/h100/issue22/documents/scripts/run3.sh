# issue #22: compare --documents on the GPU (meas/pred from the kernels' counters), and the d 64 forward's B_r for
# documents (tiles_docs.py). OUT=<dir>, COMMIT=<hash>; from the repository root. Lands in $OUT/d3.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d3; S=results/h100/issue22/documents/scripts; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
C="python3 -m iokernels.cli compare --documents 2048,2048,2048,2048,2048,2048,2048,2048 --d 64 --dtype float16 --batch 1 --heads 16 --backward --causal --repeats 3"
echo "$C" > $R/commands.txt; timeout 150 $C > $R/compare-documents.txt 2>&1; echo "rc $?" >> $R/compare-documents.txt
grep -E "total|rc" $R/compare-documents.txt | head -12
echo "python3 $S/tiles_docs.py" >> $R/commands.txt; timeout 150 python3 $S/tiles_docs.py > $R/tiles.txt 2>&1; echo "rc $?" >> $R/tiles.txt
cat $R/tiles.txt
tar czf $OUT/d3.tgz -C $OUT d3 && rm -rf $R
