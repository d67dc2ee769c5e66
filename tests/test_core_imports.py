"""The pure protocol core imports no I/O library (STYLE.md habit 1).

Core = every module of ``tenzro_training`` and of its subpackages except the shells listed in
``SHELLS``.
Two checks: a static walk of each core module's import statements, and a dynamic check that
importing the whole core in a fresh interpreter loads none of the I/O stacks.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tenzro_training

PACKAGE_DIR = Path(tenzro_training.__file__).parent
# Shell modules and subpackages: they wrap the core with I/O and may import anything.
SHELLS = {"cli", "node", "p2p", "trainer", "chain", "keyfiles"}
FORBIDDEN = {
    "asyncio", "aiohttp", "rocksdict", "libp2p", "trio", "subprocess", "socket", "threading", "pybase64",
    "multiprocessing", "jsonrpcserver", "web3", "eth_tester", "requests", "urllib", "http",
    "storage", "rpc", "precompile", "selectors", "signal",
}


def core_modules() -> list[Path]:
    """The package's own modules and those of its subpackages that are not shells (``gossip/``)."""
    return sorted(
        p for p in [*PACKAGE_DIR.glob("*.py"), *PACKAGE_DIR.glob("*/*.py")]
        if p.stem not in SHELLS and p.parent.name not in SHELLS and not p.stem.startswith("test")
    )


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_has_modules() -> None:
    names = {p.stem for p in core_modules()}
    assert {"errors", "spec", "merkle", "vrf", "election"} <= names


def test_core_modules_import_no_io_library() -> None:
    offenders = {
        p.name: sorted(imported_roots(p) & FORBIDDEN) for p in core_modules()
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"core modules importing I/O libraries: {offenders}"


def test_importing_core_loads_no_io_stack() -> None:
    mods = [".".join(["tenzro_training", *p.relative_to(PACKAGE_DIR).with_suffix("").parts]).removesuffix(".__init__")
            for p in core_modules()]
    probe = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in ('aiohttp', 'rocksdict', 'libp2p', 'trio', 'jsonrpcserver', 'web3',"
        " 'eth_tester', 'storage', 'rpc') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"core import pulled in: {out.stdout.strip()}"


def test_forbidden_import_is_detected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom rocksdict import Rdict\n")
    assert imported_roots(bad) & FORBIDDEN == {"asyncio", "rocksdict"}
