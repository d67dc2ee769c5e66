"""Run artifacts over HTTP (``artifacts/v1/``): their URLs under ``--rpc``, and fetching them
with the retries and the failure messages verify-run and export-model share."""

from __future__ import annotations

import time
from typing import Any

from tenzro_training.cli.client import RpcClient


def artifact_path(task_id: str, *parts: object) -> str:
    """The path of a run artifact relative to ``--rpc`` (docs/cli.md "verify-run"). The task id
    is one percent-encoded segment; ``.`` and ``..`` are encoded as ``%2E`` so that no URL
    resolution (urljoin's, a proxy's) takes them for dot segments."""
    import urllib.parse

    segment = urllib.parse.quote(task_id, safe="")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return "/".join(["artifacts/v1/runs", segment, *(str(p) for p in parts)])


def why_unavailable(exc: Any, what: str) -> Any:
    """ArtifactUnavailable ``exc`` restated for the artifact ``what``: a 410 is a pruned payload
    (``prune_payloads``), which makes the run unverifiable from this node; a 404 one the node
    does not serve (not committed, not accepted, or an older node without the routes)."""
    from tenzro_training.errors import ArtifactUnavailable

    if exc.status == 410:
        return ArtifactUnavailable(f"the node pruned {what} ({exc.reason}): the run cannot be verified from "
                                   "this node", exc.status)
    if exc.status == 404:
        return ArtifactUnavailable(f"the node does not serve {what} ({exc.reason})", exc.status)
    return ArtifactUnavailable(f"{what}: {exc.reason}", exc.status)


BUSY_RETRIES = 10
"""How many times an artifact the node answered 503 (its in-flight byte budget full: docs/rpc.md
"Run artifacts over HTTP") is asked for again, BUSY_RETRY_S apart, before it is a failed check."""
BUSY_RETRY_S = 1.0
"""The wait before asking again (the node's ``Retry-After: 1``)."""


def fetch_when_room(client: RpcClient, path: str, max_bytes: int) -> bytes:
    """``client.fetch_artifact``, asked again after a 503: a node busy serving other clients
    (or this one's parallel downloads of large payloads) says "retry later", which is not a
    verdict on the run."""
    from tenzro_training.errors import ArtifactUnavailable

    retries = 0
    while True:
        try:
            return client.fetch_artifact(path, max_bytes)
        except ArtifactUnavailable as exc:
            if exc.status != 503 or retries == BUSY_RETRIES:
                raise
        retries += 1
        time.sleep(BUSY_RETRY_S)
