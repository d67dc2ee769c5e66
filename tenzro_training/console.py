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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from tenzro_training.cli import main as run
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
