"""JSON-RPC 2.0 shell: the ``tenzro_training_*`` methods over HTTP (see docs/rpc.md).

- :mod:`rpc.service`: the :class:`TrainingService` Protocol the node service implements;
- :mod:`rpc.params`: typed, shape-only parsing of each method's params;
- :mod:`rpc.errors`: the one exception -> error-code table;
- :mod:`rpc.dispatcher`: transport-agnostic dispatch (bytes or dicts in and out);
- :mod:`rpc.server`: the aiohttp endpoint;
- :mod:`rpc.artifacts`: run artifacts (payloads, final models, checkpoints) over plain HTTP GET.

This package is NOT the node: it holds no state and applies no protocol rule.
"""

from rpc.dispatcher import METHODS, Dispatcher
from rpc.errors import ERROR_TABLE, InvalidParams, compute_error_object
from rpc.server import DEFAULT_MAX_BODY_BYTES, RunningServer, create_app, run_server, start_server
from rpc.service import TrainingService

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ERROR_TABLE",
    "METHODS",
    "Dispatcher",
    "InvalidParams",
    "RunningServer",
    "TrainingService",
    "compute_error_object",
    "create_app",
    "run_server",
    "start_server",
]
