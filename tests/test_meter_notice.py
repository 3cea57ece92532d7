"""The meter shows a pending reclaim to the workloads on its node (meter/notice.py): the
operator's signed reclaim, checked against the metered terms, becomes a notice file and an
answer at GET /reclaim on loopback, before the effective time; anything else is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools import builders
from devtools.scenario import write_meter_setup
from gridledger.cli import main as gridledger_main
from meter.config import load_meter_config
from meter.notice import NoticeServer, notice_path
from proto.envelope import seal
from proto.records import ReclaimNotice

ROOT = Path(__file__).resolve().parents[1]


def test_a_signed_reclaim_reaches_the_node_before_it_takes_effect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cast = builders.make_cast("notice")
    now_ms = int(time.time() * 1000)
    terms = builders.make_terms(
        cast, "pn-1", [builders.gpu("n1", 0), builders.gpu("n2", 0)], now_ms, now_ms + 3_600_000
    )
    config = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    effective = now_ms + 600_000
    reclaim = tmp_path / "reclaim.json"
    reclaim.write_bytes(builders.reclaim(cast, terms, now_ms, effective, "rc-1"))
    spool = load_meter_config(config).spool_dir

    # Signed by the buyer, not the operator: refused; nothing shown.
    record = ReclaimNotice(
        placement_id="pn-1",
        reclaim_id="rc-x",
        issued_at_ms=now_ms,
        effective_at_ms=effective,
        gpus=[terms.gpus[0].uuid],
        reason="x",
    )
    forged = tmp_path / "forged.json"
    forged.write_bytes(seal(record, [cast.buyer]))
    assert gridledger_main(["meter", "notice", str(forged), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAIL: ") and "not signed by the operator" in err
    # The other node's GPU only: not this node's to show.
    other = tmp_path / "other.json"
    other.write_bytes(
        seal(ReclaimNotice(**{**_fields(record), "gpus": [terms.gpus[1].uuid]}), [cast.operator])
    )
    assert gridledger_main(["meter", "notice", str(other), "--config", str(config)]) == 1
    assert "names no GPU of node n1" in capsys.readouterr().err
    assert not notice_path(spool).exists()

    server = NoticeServer(notice_path(spool), "127.0.0.1", 0)
    server.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as none:
            urllib.request.urlopen(f"{server.url}/reclaim", timeout=10)
        assert none.value.code == 404
        assert gridledger_main(["meter", "notice", str(reclaim), "--config", str(config)]) == 0
        shown = json.loads(notice_path(spool).read_text())
        assert shown["gpus"] == [terms.gpus[0].uuid]  # this node's GPU only
        with urllib.request.urlopen(f"{server.url}/reclaim", timeout=10) as reply:
            answer = json.loads(reply.read())
        assert answer["effective_at_ms"] == effective and answer["reclaim_id"] == "rc-1"
        assert 0 < answer["seconds_left"] <= 600  # answered before the effective time
    finally:
        server.stop()


def _fields(record: ReclaimNotice) -> dict[str, object]:
    return {f: getattr(record, f) for f in record.__struct_fields__}


def test_notice_serve_answers_on_loopback(tmp_path: Path) -> None:
    cast = builders.make_cast("notice-serve")
    terms = builders.make_terms(cast, "pn-2", [builders.gpu("n1", 0)], 0, 3_600_000)
    config = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    serve = [sys.executable, "-m", "gridledger", "meter", "notice-serve", "--config", str(config)]
    done = subprocess.run(
        [*serve, "--listen", "127.0.0.1:0", "--duration-s", "0.2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "/reclaim" in done.stdout
    bad = subprocess.run(
        [*serve, "--listen", "nowhere"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("FAIL: ") and bad.stderr.count("\n") == 1
