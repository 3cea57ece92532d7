"""Key hygiene: private keys are created 0600, refused when others can read them, never shown.

What is checked, and where the seed could leak if it were wrong:

* ``gridledger keys new`` writes ``ID.key`` 0600 whatever the umask, never through a
  planted symlink, and prints no secret.
* ``proto.keys.load_signing_key`` refuses a file with any group or other permission bit,
  naming the file, its mode and the fix; its errors never quote the seed.
* ``repr``/``str``/formatting of a ``SigningKey`` (alone or inside containers and
  configs) and every structlog renderer never show the seed.
* The real processes: ``meter run`` and ``ledger run`` (and ``ledger statement``) write
  their structlog output; none of it contains the seed of the key they loaded, and both
  refuse to start with a key file readable by others.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ledger_toml

from devtools import builders
from devtools.scenario import write_meter_setup
from gridledger.cli import main as gridledger_main
from meter.config import load_meter_config
from proto.errors import KeyFileError
from proto.keys import PRIVATE_FORMAT, SigningKey, load_signing_key, write_key_pair
from transport.spool import read_spool

T0_MS = 1_767_225_600_000
MINUTE_MS = 60_000
PROCESS_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 30.0


# ---- what a leaked seed looks like ----------------------------------------------------------


def seed_forms(seed: bytes) -> list[str]:
    """Text forms a 32-byte seed could take in output, whole and in 16-character pieces."""
    b64 = base64.b64encode(seed).decode()
    whole = [
        seed.hex(),
        seed.hex().upper(),
        b64,
        b64.rstrip("="),
        base64.urlsafe_b64encode(seed).decode().rstrip("="),
        repr(seed)[2:-1],
    ]
    pieces = [seed.hex()[i : i + 16] for i in range(0, 64, 16)]
    pieces += [b64[i : i + 16] for i in range(0, 28, 12)]
    return whole + pieces


def assert_no_seed(output: str | bytes, seed: bytes, where: str) -> None:
    """Fail naming the form if any form of ``seed`` occurs in ``output``."""
    if isinstance(output, bytes):
        assert seed[:12] not in output, f"{where}: raw seed bytes in output"
        text = output.decode("utf-8", "replace")
    else:
        text = output
    for form in seed_forms(seed):
        assert form not in text, f"{where}: seed form {form!r} found in output"


def test_the_leak_detector_detects() -> None:
    """The checks below mean something only if this detector catches a real leak."""
    key = SigningKey.generate("n")
    for leaked in (key.seed.hex(), base64.b64encode(key.seed).decode(), repr(key.seed)):
        with pytest.raises(AssertionError):
            assert_no_seed(f"event=x value={leaked}", key.seed, "probe")
    with pytest.raises(AssertionError):
        assert_no_seed(b"..." + key.seed + b"...", key.seed, "probe")
    assert_no_seed(repr(key) + key.key_id + key.public_key.hex(), key.seed, "public parts")


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# ---- gridledger keys new --------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o000, 0o002, 0o022, 0o077])
def test_keys_new_writes_the_private_key_0600_whatever_the_umask(
    tmp_path: Path, mask: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "keys"
    with umask(mask):
        code = gridledger_main(["keys", "new", "--id", "node-a", "--out", str(out)])
    assert code == 0
    private = out / "node-a.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.stat().st_uid == os.getuid()
    key = load_signing_key(private)
    printed = capsys.readouterr()
    assert key.key_id in printed.out
    assert_no_seed(printed.out + printed.err, key.seed, "keys new output")
    # The public half is meant to be shared; it holds no secret either.
    assert_no_seed((out / "node-a.pub").read_bytes(), key.seed, "public key file")


def test_keys_new_does_not_write_through_a_planted_symlink(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    out.mkdir()
    target = tmp_path / "world-readable-place"
    (out / "node-a.key").symlink_to(target)  # dangling: O_EXCL must refuse, not follow
    code = gridledger_main(["keys", "new", "--id", "node-a", "--out", str(out)])
    assert code == 1
    assert not target.exists()


def test_keys_new_refuses_to_overwrite_an_existing_key(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    assert gridledger_main(["keys", "new", "--id", "node-a", "--out", str(out)]) == 0
    before = (out / "node-a.key").read_bytes()
    assert gridledger_main(["keys", "new", "--id", "node-a", "--out", str(out)]) == 1
    assert (out / "node-a.key").read_bytes() == before


# ---- load_signing_key -----------------------------------------------------------------------

OPEN_MODES = [0o640, 0o620, 0o610, 0o604, 0o602, 0o601, 0o644, 0o660, 0o666, 0o700 | 0o070]


def _ours(tmp: Path) -> tuple[Path, SigningKey]:
    key = SigningKey.generate("node-a")
    private, _ = write_key_pair(key, tmp)
    return private, key


def _pem(tmp: Path) -> tuple[Path, SigningKey]:
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    path = tmp / "node-a.pem"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    return path, SigningKey("node-a", seed)


KEY_FILES: dict[str, Callable[[Path], tuple[Path, SigningKey]]] = {"json": _ours, "pem": _pem}


@pytest.mark.parametrize("kind", sorted(KEY_FILES))
@pytest.mark.parametrize("mode", OPEN_MODES, ids=[f"{m:o}" for m in OPEN_MODES])
def test_a_key_file_others_can_access_is_refused(tmp_path: Path, kind: str, mode: int) -> None:
    path, key = KEY_FILES[kind](tmp_path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as caught:
        load_signing_key(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"{mode:o}" in message
    assert "chmod 600" in message
    assert_no_seed(message, key.seed, "refusal message")


@pytest.mark.parametrize("kind", sorted(KEY_FILES))
@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_an_owner_only_key_file_is_read(tmp_path: Path, kind: str, mode: int) -> None:
    path, key = KEY_FILES[kind](tmp_path)
    os.chmod(path, mode)
    loaded = load_signing_key(path)
    assert loaded.seed == key.seed
    assert loaded.public_key == key.public_key


def test_a_symlink_to_a_readable_key_is_refused(tmp_path: Path) -> None:
    path, _ = _ours(tmp_path)
    os.chmod(path, 0o644)
    link = tmp_path / "link.key"
    link.symlink_to(path)  # the link's own mode (0777) is not what counts: the target's is
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signing_key(link)


def _secret_file(secret: bytes, **changes: Any) -> bytes:
    body: dict[str, Any] = {
        "format": PRIVATE_FORMAT,
        "id": "node-a",
        "seed": base64.b64encode(secret).decode(),
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


BROKEN_FILES: dict[str, Callable[[bytes], bytes]] = {
    "wrong format": lambda s: _secret_file(s, format="gridledger-ed25519-private/v0"),
    "unknown field": lambda s: _secret_file(s, comment="hi"),
    "seed too long": lambda s: _secret_file(s, seed=base64.b64encode(s + s[:1]).decode()),
    "seed too short": lambda s: _secret_file(s, seed=base64.b64encode(s[:31]).decode()),
    "seed as hex": lambda s: _secret_file(s, seed=s.hex()),
    "seed as list": lambda s: _secret_file(s, seed=list(s)),
    "id not a string": lambda s: _secret_file(s, id=7),
    "no id": lambda s: _secret_file(s, id=None),
    "truncated": lambda s: _secret_file(s)[:-9],
    "two documents": lambda s: _secret_file(s) + _secret_file(s),
    "not utf-8": lambda s: b"\xff\xfe" + _secret_file(s),
    "PEM with garbage": lambda s: b"-----BEGIN PRIVATE KEY-----\n" + base64.b64encode(s) + b"\n",
}


# Random seeds, not degenerate ones: 16 zero hex digits also occur in honest output.
SEEDS = st.binary(min_size=32, max_size=32).filter(lambda s: len(set(s)) >= 16)


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, broken=st.sampled_from(sorted(BROKEN_FILES)))
def test_errors_about_a_broken_key_file_never_quote_the_seed(
    tmp_path_factory: pytest.TempPathFactory, seed: bytes, broken: str
) -> None:
    path = tmp_path_factory.mktemp("broken") / "node-a.key"
    path.write_bytes(BROKEN_FILES[broken](seed))
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as caught:
        load_signing_key(path)
    assert str(path) in str(caught.value)
    assert_no_seed(str(caught.value), seed, f"error for {broken}")
    assert_no_seed(repr(caught.value), seed, f"repr of error for {broken}")


# ---- SigningKey as text -----------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(seed=SEEDS, name=st.from_regex(r"[a-z][a-z0-9-]{0,20}"))
def test_a_signing_key_never_shows_its_seed_as_text(seed: bytes, name: str) -> None:
    key = SigningKey(name, seed)
    shown = [
        repr(key),
        str(key),
        f"{key}",
        f"{key!r}",
        "%s %r" % (key, key),  # noqa: UP031  (the logging module formats this way)
        repr([key]),
        repr({"key": key}),
        repr((key,)),
        str(ValueError("bad", key)),
    ]
    for text in shown:
        assert key.key_id in text
        assert_no_seed(text, seed, "SigningKey text")


def test_cast_and_agent_config_reprs_never_show_seeds() -> None:
    cast = builders.make_cast("repr")
    node = cast.node_key("node-a")
    text = repr(cast)
    for key in (cast.operator, cast.buyer, cast.desk, cast.ledger, node):
        assert key.key_id in text
        assert_no_seed(text, key.seed, f"repr(Cast) for {key.name}")


def test_serializing_a_signing_key_does_not_reveal_the_seed() -> None:
    key = SigningKey.generate("node-a")
    try:
        encoded = msgspec.json.encode(key)
    except (TypeError, msgspec.EncodeError):
        encoded = b""
    assert_no_seed(encoded, key.seed, "msgspec.json.encode(SigningKey)")
    try:
        to_dict: Callable[[Any], Any] = dataclasses.asdict  # a dataclass would comply
        as_dict = repr(to_dict(key))
    except TypeError:
        as_dict = ""
    assert_no_seed(as_dict, key.seed, "dataclasses.asdict(SigningKey)")


def _render_with(renderer: Any, event: str, **fields: Any) -> str:
    out = io.StringIO()
    logger = structlog.wrap_logger(
        structlog.PrintLogger(out),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    logger.info(event, **fields)
    try:
        raise KeyFileError(f"while using {fields.get('key')!r}")
    except KeyFileError:
        logger.exception("failed", **fields)
    return out.getvalue()


RENDERERS: dict[str, Callable[[], Any]] = {
    "json": structlog.processors.JSONRenderer,
    "keyvalue": structlog.processors.KeyValueRenderer,
    "logfmt": structlog.processors.LogfmtRenderer,
    "console": lambda: structlog.dev.ConsoleRenderer(colors=False),
}


@pytest.mark.parametrize("renderer", sorted(RENDERERS))
def test_structlog_renderers_never_show_a_seed(renderer: str) -> None:
    key = SigningKey.generate("ledger-1")
    cast = builders.make_cast("render")
    text = _render_with(
        RENDERERS[renderer](), "key_loaded", key=key, keys=[key], nested={"k": key}, cast=cast
    )
    assert key.key_id in text  # the key was rendered, through its repr
    assert_no_seed(text, key.seed, f"{renderer} renderer")
    assert_no_seed(text, cast.ledger.seed, f"{renderer} renderer (cast)")


def test_kafka_passwords_stay_out_of_config_reprs(tmp_path: Path) -> None:
    cast = builders.make_cast("password")
    terms = builders.make_terms(cast, "p-pw", [builders.gpu("node-a", 0)], T0_MS, T0_MS + 60_000)
    password = "pw-" + os.urandom(12).hex()
    config_path = write_meter_setup(
        tmp_path,
        cast,
        "node-a",
        [terms],
        transport="kafka",
        kafka={
            "bootstrap": "127.0.0.1:9092",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "node-a",
            "sasl_password": password,
        },
    )
    config = load_meter_config(config_path)
    assert config.kafka is not None and config.kafka.sasl_password == password
    assert password not in repr(config)
    assert password not in str(config)
    assert "***" in repr(config)


# ---- the real processes ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    """One placement metered by node-a and settled by ledger-1, in local mode."""

    tmp: Path
    cast: builders.Cast
    meter_config: Path
    ledger_config: Path
    ledger_db: Path
    local_dir: Path
    node_key_file: Path
    ledger_key_file: Path
    intervals: int

    @property
    def seeds(self) -> dict[str, bytes]:
        return {
            "node": self.cast.node_key("node-a").seed,
            "ledger": self.cast.ledger.seed,
        }


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    intervals = 5
    cast = builders.make_cast(f"hygiene-{os.urandom(4).hex()}")  # fresh seeds per run
    terms = builders.make_terms(
        cast, "p-keys", [builders.gpu("node-a", 0)], T0_MS, T0_MS + intervals * MINUTE_MS
    )
    local_dir = tmp_path / "local"
    meter_config = write_meter_setup(
        tmp_path, cast, "node-a", [terms], local_dir=local_dir, simulate="seed=3"
    )
    # The ledger reads the published terms from the local transport, as in the demo.
    from transport.local import publish_local, publisher_source

    publish_local(local_dir, publisher_source("desk"), [builders.signed_terms(cast, terms)])
    ledger_key_file, _ = write_key_pair(cast.ledger, tmp_path / "ledger-keys")
    ledger_db = tmp_path / "ledger.duckdb"
    ledger_config = ledger_toml(
        tmp_path / "ledger.toml",
        ledger_key_file,
        db=ledger_db,
        local_dir=local_dir,
        http="127.0.0.1:0",
        clock_ms=T0_MS + intervals * MINUTE_MS,
    )
    node_key_file = meter_config.parent / "keys" / "node-a.key"
    return Setup(
        tmp_path,
        cast,
        meter_config,
        ledger_config,
        ledger_db,
        local_dir,
        node_key_file,
        ledger_key_file,
        intervals,
    )


def _gridledger(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gridledger", *args],
        capture_output=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _meter_run(setup: Setup) -> subprocess.CompletedProcess[bytes]:
    until = str(T0_MS + setup.intervals * MINUTE_MS)
    return _gridledger("meter", "run", "--config", str(setup.meter_config), "--until-ms", until)


def _assert_clean(output: bytes, setup: Setup, where: str) -> None:
    for name, seed in setup.seeds.items():
        assert_no_seed(output, seed, f"{where} ({name} key)")
    for key_file in (setup.node_key_file, setup.ledger_key_file):
        with contextlib.suppress(FileNotFoundError):
            assert key_file.read_bytes().strip() not in output, f"{where}: key file echoed"


def test_meter_run_logs_never_contain_the_node_seed(setup: Setup) -> None:
    done = _meter_run(setup)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output.decode(errors="replace")[-3000:]
    assert b"agent_started" in output  # the structlog output we inspect is really there
    spooled = list(read_spool(setup.local_dir / "node-node-a"))
    assert len(spooled) == setup.intervals
    _assert_clean(output, setup, "meter run")


def test_meter_refuses_a_key_file_others_can_read(setup: Setup) -> None:
    os.chmod(setup.node_key_file, 0o644)
    done = _meter_run(setup)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output.decode(errors="replace")[-3000:]
    assert b"chmod 600" in output
    assert not (setup.local_dir / "node-node-a").exists() or not list(
        read_spool(setup.local_dir / "node-node-a")
    )
    _assert_clean(output, setup, "meter refusal")


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)


def test_ledger_run_and_statement_logs_never_contain_the_ledger_seed(setup: Setup) -> None:
    assert _meter_run(setup).returncode == 0
    log_path = setup.tmp / "ledger.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gridledger",
                "ledger",
                "run",
                "--config",
                str(setup.ledger_config),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            port_file = setup.ledger_db.with_name(setup.ledger_db.name + ".http.json")

            def statement_ready() -> bool:
                assert process.poll() is None, log_path.read_text()[-3000:]
                if not port_file.exists():
                    return False
                done = _gridledger(
                    "ledger", "statement", "p-keys", "--config", str(setup.ledger_config), "--json"
                )
                if done.returncode != 0:
                    return False
                body = json.loads(done.stdout)
                _assert_clean(done.stdout + done.stderr, setup, "ledger statement")
                return int(body["totals"]["delivered_mgms"]) > 0

            _wait_for(statement_ready, READY_TIMEOUT_S, "the ledger to fold the node's events")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=PROCESS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=PROCESS_TIMEOUT_S)
    output = log_path.read_bytes()
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
    assert b"ledger_running" in output
    _assert_clean(output, setup, "ledger run")


def test_ledger_refuses_a_key_file_others_can_read(setup: Setup) -> None:
    os.chmod(setup.ledger_key_file, 0o640)
    done = _gridledger("ledger", "run", "--config", str(setup.ledger_config))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output.decode(errors="replace")[-3000:]
    assert b"chmod 600" in output
    assert not setup.ledger_db.exists()
    _assert_clean(output, setup, "ledger refusal")
