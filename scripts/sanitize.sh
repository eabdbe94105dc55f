#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every kernel variant, with provenance:
# the logs, summary.txt / summary.json and env.txt land in $OUT (default results/h200/sanitize). Extra
# arguments go to `python -m iokernels.sanitize` (e.g. --quick, --tools memcheck). Run from the repository root.
set -uo pipefail
OUT=${OUT:-results/h200/sanitize}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, sys; print('cupy', cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])"
  git rev-parse --short HEAD
  date -u; } > "$OUT/env.txt" 2>&1
python3 -m iokernels.sanitize --out "$OUT" "$@"
rc=$?
echo "exit code $rc" >> "$OUT/env.txt"
exit $rc
