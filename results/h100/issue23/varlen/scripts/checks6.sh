# issue #23: racecheck on the dense tma backward with eight steps per key block (san_probe.py dense-steps): do the
# hazards checks5.sh reported in the varlen backward (the loader's lse/D stores against the consumers' reads of the
# same ring stage) show in the dense kernel too? OUT=<dir>, COMMIT=<hash>; run from the repository root.
export PYTHONPATH=. PYTHONUNBUFFERED=1 IOKERNELS_COMMIT=${COMMIT:?give COMMIT}
R=$OUT; S=results/h100/issue23/varlen/scripts; mkdir -p $R
python3 $S/san_probe.py dense-steps plain > /dev/null 2>&1  # compile outside the sanitizer
timeout 45 compute-sanitizer --tool racecheck python3 $S/san_probe.py dense-steps plain > $R/race-dense-steps.txt 2>&1
echo "rc $?" >> $R/race-dense-steps.txt; grep -aE "RACECHECK SUMMARY|ERROR SUMMARY|s$|rc|Error: Race" $R/race-dense-steps.txt | head -8
