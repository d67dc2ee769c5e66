"""Compile contracts/src/*.sol with the pinned solc-js (node + contracts/compile.js), cached.

What this module is: :func:`compile_contracts`, which returns ``{contract name: Artifact}`` for
every contract in ``contracts/src``, compiling on demand: the standard-JSON input (sources +
settings) and the toolchain versions are hashed, and the solc output is cached as
``contracts/build/<hash>.json`` (gitignored), so a second call with unchanged sources is a file
read. Settings: evmVersion "prague" (py-evm has no osaka), optimizer on (200 runs).

What it is NOT: a deployer (tests/chain/conftest.py deploys) or a toolchain installer
(scripts/bootstrap runs ``npm ci`` in contracts/).

Usage: ``python contracts/build.py`` compiles and prints each contract's bytecode size.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTRACTS_DIR = Path(__file__).resolve().parent
SRC_DIR = CONTRACTS_DIR / "src"
BUILD_DIR = CONTRACTS_DIR / "build"
SOLC_VERSION = "0.8.28"
SETTINGS: dict[str, Any] = {
    "evmVersion": "prague",
    "optimizer": {"enabled": True, "runs": 200},
    "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}},
}


class CompileError(RuntimeError):
    """solc reported errors, or the toolchain is missing."""


@dataclass(frozen=True)
class Artifact:
    name: str
    source: str
    abi: list[dict[str, Any]]
    bytecode: str
    """0x-hex creation code."""
    deployed_bytecode: str


def _sources(files: tuple[str, ...] | None) -> dict[str, dict[str, str]]:
    paths = sorted(SRC_DIR.glob("*.sol")) if files is None else [SRC_DIR / f for f in sorted(files)]
    return {p.name: {"content": p.read_text(encoding="utf-8")} for p in paths}


def _standard_input(files: tuple[str, ...] | None) -> dict[str, Any]:
    return {"language": "Solidity", "sources": _sources(files), "settings": SETTINGS}


def _cache_key(std_input: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(std_input, sort_keys=True).encode())
    # Imported local files are resolved by compile.js, outside the input: hash them all.
    for path in sorted(SRC_DIR.glob("*.sol")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for extra in ("compile.js", "package-lock.json"):
        path = CONTRACTS_DIR / extra
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def _run_solc(std_input: dict[str, Any]) -> dict[str, Any]:
    if not (CONTRACTS_DIR / "node_modules" / "solc").is_dir():
        raise CompileError("contracts/node_modules is missing: run scripts/bootstrap (npm ci in contracts/)")
    proc = subprocess.run(
        ["node", str(CONTRACTS_DIR / "compile.js")],
        input=json.dumps(std_input).encode(),
        capture_output=True,
        cwd=CONTRACTS_DIR,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise CompileError(f"compile.js failed: {proc.stderr.decode(errors='replace')}")
    output: dict[str, Any] = json.loads(proc.stdout)
    errors = [e for e in output.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise CompileError("\n".join(e.get("formattedMessage", e.get("message", "")) for e in errors))
    return output


def compile_contracts(files: tuple[str, ...] | None = None, force: bool = False) -> dict[str, Artifact]:
    """Every contract of contracts/src (or of ``files``, e.g. ``("TenzroRewardEscrow.sol",)``,
    plus what they import), by name; cached by source hash; ``force`` recompiles. Compiling only
    the files a test needs keeps one broken contract from failing unrelated tests."""
    std_input = _standard_input(files)
    key = _cache_key(std_input)
    cache = BUILD_DIR / f"{key}.json"
    if cache.exists() and not force:
        output = json.loads(cache.read_text())
    else:
        output = _run_solc(std_input)
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(output))
        tmp.replace(cache)  # atomic: parallel test runs never read a half-written cache
    artifacts: dict[str, Artifact] = {}
    for source, contracts in output.get("contracts", {}).items():
        for name, c in contracts.items():
            artifacts[name] = Artifact(
                name=name,
                source=source,
                abi=c["abi"],
                bytecode="0x" + c["evm"]["bytecode"]["object"],
                deployed_bytecode="0x" + c["evm"]["deployedBytecode"]["object"],
            )
    return artifacts


if __name__ == "__main__":
    names = tuple(a for a in sys.argv[1:] if a.endswith(".sol")) or None
    for n, a in sorted(compile_contracts(names, force="--force" in sys.argv).items()):
        print(f"{n:32s} {a.source:32s} {(len(a.deployed_bytecode) - 2) // 2:6d} bytes deployed")
