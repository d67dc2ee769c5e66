"""``tenzro train verify-receipt``: a good getReceipt file exits 0, a tampered one 1, each check on
its own line; ``--task-id`` fetches the same result over JSON-RPC (a canned stdlib endpoint)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tenzro_training import cli
from tenzro_training.receipt_check import CHECK_NAMES
from tests.chain.conftest import run_to_sealed


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = run_to_sealed(tmp_path_factory.mktemp("run"))
    return json.loads(json.dumps(run.service.get_receipt(run.task_id)))


def _write(path: Path, doc: Any) -> str:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))  # as get-receipt --out writes it
    return str(path)


def test_verify_receipt_file_good(result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["train", "verify-receipt", "--file", _write(tmp_path / "r.json", result)])
    out = capsys.readouterr().out.splitlines()
    assert code == cli.EXIT_OK
    assert out[0] == f"task  {result['receipt']['task_id']} (named by the file)"  # which run was checked
    assert [line.split()[1] for line in out[1:]] == list(CHECK_NAMES)
    assert all(line.startswith("ok ") for line in out[1:])


def test_invalid_verify_receipt_file_tampered(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(json.dumps(result))
    sig = doc["attestations"]["rounds"][0]["finalize_signature"]
    doc["attestations"]["rounds"][0]["finalize_signature"] = sig[:-4] + ("00" if sig[-4:-2] != "00" else "11") + sig[-2:]
    code = cli.main(["train", "verify-receipt", "--file", _write(tmp_path / "bad.json", doc)])
    captured = capsys.readouterr()
    assert code == 1
    failed = [line.split()[1] for line in captured.out.splitlines() if line.startswith("FAIL")]
    assert failed == ["finalize_signatures"]
    assert "finalize_signatures" in captured.err


def test_invalid_verify_receipt_wrong_chain_and_not_json(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "r.json", result)
    assert cli.main(["train", "verify-receipt", "--file", path, "--chain-id", "5"]) == 1
    (tmp_path / "junk.json").write_text("{not json")
    assert cli.main(["train", "verify-receipt", "--file", str(tmp_path / "junk.json")]) == 1
    assert "FAIL  decode" in capsys.readouterr().out
    assert cli.main(["train", "verify-receipt", "--file", str(tmp_path / "missing.json")]) == cli.EXIT_USAGE


def test_invalid_verify_receipt_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "verify-receipt"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["train", "verify-receipt", "--task-id", "a", "--file", "b"])


@pytest.fixture
def endpoint(result: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    calls: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append((body["method"], body["params"]))
            data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", calls
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_verify_receipt_task_id_over_rpc(
    result: dict[str, Any], endpoint: tuple[str, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, calls = endpoint
    task_id = result["receipt"]["task_id"]
    code = cli.main(["train", "verify-receipt", "--task-id", task_id, "--rpc", url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] is True
    assert [c["name"] for c in report["checks"]] == ["task_id", *CHECK_NAMES]  # the run asked for comes first
    assert report["skipped"] == []
    assert calls == [("tenzro_training_getReceipt", {"task_id": task_id})]


def test_invalid_verify_receipt_of_another_run_than_asked(
    result: dict[str, Any], endpoint: tuple[str, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI probe (stop 20): a node answering getReceipt of run A with run B's valid receipt
    passed every check, and no line named the run."""
    url, _ = endpoint
    code = cli.main(["train", "verify-receipt", "--task-id", "run-A", "--rpc", url])
    captured = capsys.readouterr()
    assert code == cli.EXIT_RPC_ERROR
    lines = captured.out.splitlines()
    assert lines[0].split()[:2] == ["FAIL", "task_id"] and repr(result["receipt"]["task_id"]) in lines[0]
    assert all(line.startswith("ok ") for line in lines[1:])  # the receipt itself is fine
    assert captured.err == "tenzro: receipt verification failed: task_id\n"


def test_verify_receipt_file_without_abi_says_it_skipped_it(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {k: v for k, v in result.items() if k != "abi"}
    assert cli.main(["train", "verify-receipt", "--file", _write(tmp_path / "r.json", doc)]) == cli.EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[-1].split()[:2] == ["skip", "abi"] and "abi" not in [line.split()[1] for line in out[1:-1]]
    assert cli.main(["train", "verify-receipt", "--file", _write(tmp_path / "r.json", doc), "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["skipped"] == ["abi"]
