"""The ``tenzro`` console script's entry point.

Why a module of its own: the command's imports (eth-account, pydantic, aiohttp) take about a
third of a second, and a Ctrl-C during them arrived before ``cli.main`` could catch it, so the
user got a KeyboardInterrupt traceback instead of the quiet exit status 130 that every later
moment gives. Importing the CLI here, inside the handler, closes that window.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_INTERRUPTED = 130
"""128 + SIGINT, what shells report for a command stopped by Ctrl-C."""

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what shells report for a command whose reader went away (``... | head``)."""


EXIT_BROKEN_INSTALL = 2
"""The usage/startup status: the installation, not the command, is wrong."""

_SIBLINGS = ("rpc", "storage", "precompile")
"""The top-level packages this distribution installs beside ``tenzro_training``. Their names
are generic: PyPI has other distributions that install a top-level ``storage`` or ``rpc``, and
pip lets one overwrite the other's files without a word (packaging probe)."""


def check_installation() -> str | None:
    """None when ``rpc``, ``storage`` and ``precompile`` are this distribution's packages (regular
    packages in the directory that holds ``tenzro_training``), else one line saying which is not.
    Found by path, without importing them: a foreign package's import would run its code."""
    import importlib.util
    from pathlib import Path

    home = Path(__file__).resolve().parent.parent
    for name in _SIBLINGS:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None or spec.origin is None else Path(spec.origin).resolve()
        if origin is None or origin.parent != home / name:  # __init__.py, or .pyc in a sourceless install
            where = "is missing" if spec is None else f"resolves to {origin or 'a namespace package'}"
            return (f"the installed {name!r} package is not tenzro-training's ({where}; expected {home / name}): "
                    f"another distribution with a package of that name overwrote or shadows it; reinstall "
                    f"tenzro-training in a virtualenv of its own")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        broken = check_installation()
        if broken is not None:
            print(f"tenzro: {broken}", file=sys.stderr)
            return EXIT_BROKEN_INSTALL
        from tenzro_training.cli import main as run
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
