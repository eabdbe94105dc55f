"""Fits, text and plots of sweep JSON files made with --no-fit (where scipy or matplotlib was missing).

    python3 scripts/sweeps_post.py results/h200/sweeps/*.json

Rewrites each NAME.json with its fits and writes NAME.txt and NAME.png beside it (needs scipy and
matplotlib: pip install -e '.[sweep,plot]').
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from iokernels import sweep
from iokernels.plotting import plot


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        doc = sweep.refit(json.loads(path.read_text()))
        path.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        text = path.with_suffix(".txt")
        first = text.read_text().splitlines()[:1] if text.exists() else []
        command = [line for line in first if line.startswith("iokernels sweep")]
        text.write_text("\n".join([*command, sweep.render(doc)]) + "\n")
        plot(doc, str(path.with_suffix(".png")))
        print(f"{path}: {len(doc['fits'])} fits, {path.with_suffix('.png')}")


if __name__ == "__main__":
    main(sys.argv[1:])
