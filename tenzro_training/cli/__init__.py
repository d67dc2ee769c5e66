"""The ``tenzro`` command line: a SHELL over the JSON-RPC API and the node service.

``tenzro node`` runs the node (``node/main.py``); ``tenzro train <verb>`` wraps the seven
``tenzro_training_*`` methods plus ``cancel-task``, ``verify-receipt`` (re-checks a receipt, its
election and its signatures: ``receipt_check.py``), ``verify-run`` (recomputes a sealed run from
the payloads, checkpoint and model the node serves under ``artifacts/v1/``: ``run_replay.py``),
and helpers (``make-gradient`` writes a random OuterGradient payload, ``export-model`` copies a
sealed run's final model out of a node's data dir or downloads it, checked against the verified
receipt, ``evaluate-model`` scores model files on the spec's held-out windows, ``address``);
``tenzro syncer run`` is the syncer daemon (``node/syncer.py``).
Every signing command takes ``--key-file`` (hex, ``{"private_key"}`` JSON, or a dev-accounts.json
with ``--account``) or ``TENZRO_PRIVATE_KEY``. Output is human-readable by default and JSON with
``--json``; any failure prints one line to stderr and exits non-zero: 1 for an error the node
answered, 2 for bad usage or local input, 3 when the node is unreachable. docs/cli.md has an
example of every command.

The package, one module per concern (none imports torch, the node or libp2p at import time;
each command imports what it needs when it runs):

- ``exits``: exit statuses and ``CliError``; ``values``: argparse value types, attoTNZO amounts;
- ``client``: the JSON-RPC client and the bounds on a node's answers; ``artifacts``: run artifacts
  over HTTP; ``keys``: signing keys; ``files``: files read and written; ``output``: what is printed;
  ``layouts``: fragment layouts (also the trainer's and the gossip bridge's);
- ``run_commands``, ``verify_commands``, ``spec_commands``, ``model_commands``,
  ``operator_commands``: the commands; ``parser``: the argparse tree that names them.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from tenzro_training.cli.client import DEFAULT_RPC, RpcClient
from tenzro_training.cli.exits import EXIT_OK, EXIT_RPC_ERROR, EXIT_UNREACHABLE, EXIT_USAGE, CliError
from tenzro_training.cli.parser import build_parser
from tenzro_training.console import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from tenzro_training.errors import TenzroError
from tenzro_training.logformat import format_stderr_line
from tenzro_training.terminal import printable

__all__ = ["DEFAULT_RPC", "EXIT_OK", "EXIT_RPC_ERROR", "EXIT_UNREACHABLE", "EXIT_USAGE", "CliError", "RpcClient",
           "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        args.func(args)
    except CliError as exc:
        print(format_stderr_line(f"tenzro: {printable(str(exc))}"), file=sys.stderr)
        return exc.exit_code
    except TenzroError as exc:  # local validation (spec, address, signing inputs)
        print(format_stderr_line(f"tenzro: {printable(str(exc))}"), file=sys.stderr)
        return EXIT_USAGE
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        if not RpcClient.answers:  # no node answer was read: a bug of this program, with its traceback
            raise
        # A well-formed JSON-RPC answer whose fields are not what this command reads.
        print(format_stderr_line(f"tenzro: cannot read the node's answer ({type(exc).__name__}: "
                                 f"{printable(str(exc), 300)})"), file=sys.stderr)
        return EXIT_RPC_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`tenzro ... --json | head`): no traceback, and
        # stdout pointed at /dev/null so the interpreter's flush at exit does not fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    return EXIT_OK
