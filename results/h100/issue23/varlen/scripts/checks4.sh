# issue #23: which backward launch hangs under synccheck (san_probe.py), each under a 60 s limit.
# OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; S=results/h100/issue23/varlen/scripts; mkdir -p $R
for which in dense varlen-aligned varlen-tail; do for build in plain count; do
  python3 $S/san_probe.py $which $build > /dev/null 2>&1  # compile outside the sanitizer
  timeout 60 compute-sanitizer --tool synccheck python3 $S/san_probe.py $which $build > $R/sync-$which-$build.txt 2>&1
  echo "rc $?" >> $R/sync-$which-$build.txt; echo "== $which $build"; grep -aE "ERROR SUMMARY|s$|rc" $R/sync-$which-$build.txt
done; done
