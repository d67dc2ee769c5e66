"""pyflakes over every Python file of the project: unused imports and variables, undefined names,
redefinitions. Cheap, and it catches the dead code a refactor leaves behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("tenzro_training", "rpc", "storage", "precompile", "contracts", "scripts", "tests")


def test_pyflakes_finds_nothing() -> None:
    paths = [str(ROOT / t) for t in TREES if (ROOT / t).exists()]
    done = subprocess.run([sys.executable, "-m", "pyflakes", *paths], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
