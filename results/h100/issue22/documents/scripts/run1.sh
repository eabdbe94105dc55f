# issue #22: document masking on the variable-length tma kernels (VARLEN_HEAD_MAJOR): the probe against FlexAttention
# and the dense path (alone on the GPU first), then the GPU tests (documents, varlen, the tma backward after the
# counting builds' change) and the four sanitizers on san_docs.py. OUT=<dir>, COMMIT=<hash>; from the repository root.
# Everything lands in $OUT/d1.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT/d1; S=results/h100/issue22/documents/scripts; L=$R/logs; mkdir -p $L
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $COMMIT"; date -u) > $R/env.txt
timeout 200 python3 $S/probe_docs.py > $R/probe.txt 2> $R/probe.err; echo "rc $?" >> $R/probe.txt
cat $R/probe.txt
T="timeout 260 python3 -m pytest -q --tb=short -p no:cacheprovider"
($T tests/gpu/test_documents.py tests/gpu/test_varlen_torch.py > $L/t-documents.log 2>&1; echo "rc $?" >> $L/t-documents.log) &
($T tests/gpu/test_varlen.py > $L/t-varlen.log 2>&1; echo "rc $?" >> $L/t-varlen.log) &
($T tests/gpu/test_flash_tc_bwd.py -k "tma" > $L/t-bwd.log 2>&1; echo "rc $?" >> $L/t-bwd.log) &
(python3 $S/san_docs.py > /dev/null 2>&1; for tool in memcheck synccheck initcheck; do timeout 60 compute-sanitizer --tool $tool python3 $S/san_docs.py > $L/san-$tool.txt 2>&1; echo "rc $?" >> $L/san-$tool.txt; done) &
(sleep 15; timeout 200 compute-sanitizer --tool racecheck python3 $S/san_docs.py > $L/san-racecheck.txt 2>&1; echo "rc $?" >> $L/san-racecheck.txt) &
wait
for f in $L/*; do echo "== $f"; grep -aE "^FAILED|^ERROR|ERROR SUMMARY|RACECHECK SUMMARY|^ran|passed|failed" $f | head -12; tail -1 $f; done > $R/checks.txt
cat $R/checks.txt
tar czf $OUT/d1.tgz -C $OUT d1 && rm -rf $R
