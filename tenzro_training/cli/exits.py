"""Exit statuses of the ``tenzro`` command and CliError, the one-line failure that carries one."""

from __future__ import annotations

from tenzro_training.errors import TenzroError


EXIT_OK = 0
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CliError(TenzroError):
    """A failure the CLI reports as one line and an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, *, rpc_code: int | None = None) -> None:
        self.exit_code = exit_code
        self.rpc_code = rpc_code
        """The JSON-RPC error code of the node's answer this reports (None: not a node answer)."""
        super().__init__(message)
