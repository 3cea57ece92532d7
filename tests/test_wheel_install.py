"""The wheel, installed as a user installs it (issue 18): outside the checkout, in a fresh
venv with its dependencies from PyPI, the demo runs and a small replay of the bundled
trace excerpt meters, settles and verifies. An editable install hides missing package
data (replay_prices.toml was left out once); this does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "tests" / "data" / "openb_excerpt"


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout; returns its bin directory."""
    base = tmp_path_factory.mktemp("wheel")
    # Build from a copy of what the wheel is made of: setuptools writes build/ beside the
    # sources, and the checkout is not this test's to write.
    source = base / "src"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    for name in {p.split(".")[0] for p in packages}:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(base), str(source)],
        cwd=base,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "Deprecat" not in built.stderr, built.stderr[-3000:]  # no setuptools warnings
    (wheel,) = base.glob("gridledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("gridledger/replay_prices.toml", "proto/SPEC.md", "proto/schema/terms.json"):
        assert data in names, data
    assert not any(n.startswith(("devtools/", "tests/")) for n in names)
    venv = base / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], cwd=base).returncode == 0
    install = _run([str(venv / "bin" / "python"), "-m", "pip", "install", str(wheel)], cwd=base)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def test_the_wheel_imports_from_site_packages_only(installed: Path, tmp_path: Path) -> None:
    where = _run(
        [str(installed / "python"), "-c", "import gridledger, ledger; print(gridledger.__file__)"],
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout
    dev = _run([str(installed / "python"), "-c", "import devtools"], cwd=tmp_path)
    assert dev.returncode != 0  # the test harnesses are not shipped
    pytest_present = _run([str(installed / "python"), "-c", "import pytest"], cwd=tmp_path)
    assert pytest_present.returncode != 0  # runtime dependencies only


def test_the_installed_demo_runs(installed: Path, tmp_path: Path) -> None:
    done = _run([str(installed / "gridledger"), "demo", "--workdir", "demo"], cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "(final, witnessed by" in done.stdout
    assert "the verifier caught it" in done.stdout
    assert "Traceback" not in done.stderr


def test_the_installed_replay_runs_the_bundled_excerpt(installed: Path, tmp_path: Path) -> None:
    done = _run(
        [str(installed / "gridledger"), "replay", str(EXCERPT), "--workdir", "replay",
         "--interval-s", "7200", "--limit", "6", "--json"],
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert report["delivered_equals_trace"] is True
    assert report["verdicts"] == {"verified": 6, "failed": 0}
