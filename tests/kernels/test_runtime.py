"""kernels/runtime.py without a GPU: the source commit every result file records."""

import re
import subprocess

from iokernels.kernels import runtime


def test_the_commit_given_by_the_environment_wins(monkeypatch):
    monkeypatch.setenv("IOKERNELS_COMMIT", "abc1234")
    assert runtime.source_commit() == "abc1234"


def test_the_commit_of_this_checkout(monkeypatch):
    monkeypatch.delenv("IOKERNELS_COMMIT", raising=False)
    got = runtime.source_commit()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:  # not a checkout (an installed copy)
        assert got is None
        return
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", got) and got.split("-")[0] == head.stdout.strip()
