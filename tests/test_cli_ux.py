"""A CLI tried as a person would (issue 18): one line on bad input, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools import builders
from gridledger.cli import main as gridledger_main

T0 = 1_767_225_600_000
HOUR = 3_600_000


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        gridledger_main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("gridledger 0.")


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:1", "localhost:9"])
def test_terms_publish_to_an_unreachable_broker_is_one_line(tmp_path: Path, bootstrap: str) -> None:
    cast = builders.make_cast("cli-ux")
    terms = builders.make_terms(cast, "pl-ux", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    signed = tmp_path / "terms.signed.json"
    signed.write_bytes(builders.signed_terms(cast, terms))
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "terms", "publish", str(signed), "--kafka", bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 75, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("FAIL: ") and bootstrap in lines[0], done.stderr


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    """`gridledger ... | head`: the pipe is closed before the command writes; it stops
    quietly (exit 0, nothing on stderr), as Unix tools do."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gridledger", "keys", "new", "--id", "n1", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even started importing
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
