"""Text, fits and plots of saved `iokernels sweep --json` documents.

    python3 scripts/sweeps_post.py results/h200/sweeps/*.json

For each NAME.json: where scipy is installed, recomputes the fits (for a run made with --no-fit on a
machine without scipy) and rewrites NAME.json; writes NAME.txt (the text table, after the
`iokernels sweep ...` command line NAME.txt already started with, if any); where matplotlib is installed,
writes NAME.png. scripts/gpu_suite.sh (PARTS=sweeps) calls it after each sweep.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from iokernels.analysis import sweep
from iokernels.analysis.plotting import plot


def main(paths: list[str]) -> int:
    can_fit = importlib.util.find_spec("scipy") is not None
    can_plot = importlib.util.find_spec("matplotlib") is not None
    failed = 0
    for name in paths:
        path = Path(name)
        doc = json.loads(path.read_text())
        if can_fit:
            doc = sweep.refit(doc)
            path.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        text = path.with_suffix(".txt")
        first = text.read_text().splitlines()[:1] if text.exists() else []
        command = [line for line in first if line.startswith("iokernels sweep")]
        text.write_text("\n".join([*command, sweep.render(doc)]) + "\n")
        drawn = " (no matplotlib: no plot)"
        if can_plot:
            try:
                plot(doc, str(path.with_suffix(".png")))
                drawn = f", {path.with_suffix('.png').name}"
            except Exception as exc:  # one bad plot must not cost the other files their text
                drawn = f" (no plot: {type(exc).__name__}: {exc})"
                failed += 1
        print(f"{path}: {len(doc['fits'])} fits{'' if can_fit else ' (no scipy: not refitted)'}, {text.name}{drawn}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
