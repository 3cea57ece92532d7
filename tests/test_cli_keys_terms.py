"""`gridledger keys new` and `gridledger terms sign|show` as the three parties use them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gridledger.cli import main
from proto.envelope import open_envelope
from proto.errors import KeyFileError
from proto.keys import load_public_key, load_signing_key
from proto.records import PlacementTerms
from proto.terms import check_terms_signatures

TERMS_TOML = """
placement_id = "pl-toml-1"
window_start_ms = 2026-12-01T00:00:00Z
window_end_ms = 2026-12-01T04:00:00Z
created_at_ms = 2026-11-30T12:00:00Z
rate_basis = "gpu_hour"
rate_per_gpu_hour_minor = 189
currency = "USD"
currency_scale = 2
increment_ms = 60000
minimum_duration_ms = {minimum}
desk_fee_bps = 300
fee_payer = "buyer"
interruptible = false
reclaim_notice_ms = 900000
reclaim_penalty_bps = 5000
sla_availability_target_bps = 9900
sla_credit_bps = 1000
settlement_period_ms = 3600000
late_grace_ms = 300000
ledger_key = "file:keys/ledger-1.pub"

[operator]
id = "operator-1"
key = "file:keys/operator-1.pub"

[buyer]
id = "buyer-1"
key = "file:keys/buyer-1.pub"

[desk]
id = "desk-1"
key = "file:keys/desk-1.pub"

[[nodes]]
node_id = "node-a"
key = "file:keys/node-a.pub"
region = "eu-west-1"
fabric = "nvlink"

[[gpus]]
node_id = "{gpu_node}"
uuid = "GPU-5f2c-0"
model = "H100-80GB"
share_milli = 1000
memory_mib = 81920

[[gpus]]
node_id = "node-a"
uuid = "GPU-5f2c-1"
model = "H100-80GB"
share_milli = 500
memory_mib = 40960
"""


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    for name in ("operator-1", "buyer-1", "desk-1", "ledger-1", "node-a"):
        assert main(["keys", "new", "--id", name, "--out", str(tmp_path / "keys")]) == 0
    return tmp_path


def write_terms(workdir: Path, *, minimum: int = 3_600_000, gpu_node: str = "node-a") -> Path:
    path = workdir / "terms.toml"
    path.write_text(TERMS_TOML.format(minimum=minimum, gpu_node=gpu_node))
    return path


def test_keys_new_writes_private_0600_and_refuses_overwrite(tmp_path: Path) -> None:
    assert main(["keys", "new", "--id", "node-7", "--out", str(tmp_path)]) == 0
    private = tmp_path / "node-7.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_signing_key(private)
    assert load_public_key(tmp_path / "node-7.pub").key == key.public_key
    assert main(["keys", "new", "--id", "node-7", "--out", str(tmp_path)]) == 1
    assert main(["keys", "new", "--id", "bad id", "--out", str(tmp_path)]) == 2


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    assert main(["keys", "new", "--id", "n", "--out", str(tmp_path)]) == 0
    os.chmod(tmp_path / "n.key", 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signing_key(tmp_path / "n.key")


def test_a_key_file_of_the_other_kind_names_the_one_beside_it(tmp_path: Path) -> None:
    assert main(["keys", "new", "--id", "n", "--out", str(tmp_path)]) == 0
    private, public = tmp_path / "n.key", tmp_path / "n.pub"
    with pytest.raises(KeyFileError) as caught:
        load_signing_key(public)
    assert (
        str(caught.value) == f"{public} is a public key file; sign with the private key ({private})"
    )
    with pytest.raises(KeyFileError) as caught:
        load_public_key(private)
    assert str(caught.value) == f"{private} is a private key file; give the public key ({public})"
    alone = tmp_path / "alone"
    alone.mkdir()
    for path in (alone / "n.pub", alone / "n.key"):  # the public key, named either way
        path.write_bytes(public.read_bytes())
        path.chmod(0o600)
    with pytest.raises(KeyFileError, match=r"private key \(ID\.key, written beside it\)$"):
        load_signing_key(alone / "n.key")  # never names itself as the private key
    (alone / "n.key").unlink()
    with pytest.raises(KeyFileError, match=r"private key \(ID\.key, written beside it\)$"):
        load_signing_key(alone / "n.pub")
    (alone / "n.pub").write_bytes(private.read_bytes())
    with pytest.raises(KeyFileError, match=r"public key \(ID\.pub\)$"):
        load_public_key(alone / "n.pub")


def test_pkcs8_pem_key_is_read(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "op.pem"
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    key = load_signing_key(path)
    raw_public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert key.public_key == raw_public
    message = b"gridledger/usage/v1\n{}"
    private.public_key().verify(key.sign(message), message)  # raises if wrong


def test_three_parties_sign_apart_then_show_is_complete(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = write_terms(workdir)
    signed = workdir / "terms.signed.json"
    keys = workdir / "keys"
    assert main(["terms", "show", str(toml)]) == 3  # valid, unsigned
    assert main(["terms", "sign", str(toml), "--key", str(keys / "buyer-1.key")]) == 0
    assert main(["terms", "show", str(signed)]) == 3
    out = capsys.readouterr().out
    assert "buyer     signed" in out and "operator  MISSING" in out
    assert main(["terms", "sign", str(signed), "--key", str(keys / "operator-1.key")]) == 0
    assert main(["terms", "sign", str(signed), "--key", str(keys / "desk-1.key")]) == 0
    capsys.readouterr()
    assert main(["terms", "show", str(signed)]) == 0
    assert "OK: fully signed" in capsys.readouterr().out
    opened = open_envelope(signed.read_bytes().rstrip(b"\n"))
    assert isinstance(opened.record, PlacementTerms)
    assert check_terms_signatures(opened.envelope, opened.record)
    assert opened.record.window_end_ms - opened.record.window_start_ms == 4 * 3_600_000


def test_a_key_outside_the_terms_cannot_sign(workdir: Path) -> None:
    toml = write_terms(workdir)
    assert main(["terms", "sign", str(toml), "--key", str(workdir / "keys" / "node-a.key")]) == 1


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"minimum": 5 * 3_600_000}, "shorter than minimum_duration_ms"),
        ({"gpu_node": "node-zz"}, "which is not in nodes"),
    ],
)
def test_inconsistent_terms_are_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, object], expected: str
) -> None:
    toml = write_terms(workdir, **edit)  # type: ignore[arg-type]
    key = workdir / "keys" / "operator-1.key"
    assert main(["terms", "sign", str(toml), "--key", str(key)]) == 1
    assert expected in capsys.readouterr().err
    assert main(["terms", "show", str(toml)]) == 1


def test_unknown_currency_scale_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = write_terms(workdir)
    toml.write_text(toml.read_text().replace("currency_scale = 2", "currency_scale = 1"))
    assert main(["terms", "sign", str(toml), "--key", str(workdir / "keys" / "buyer-1.key")]) == 1
    assert "currency_scale 1 for USD" in capsys.readouterr().err
    toml.write_text(toml.read_text().replace('currency = "USD"', 'currency = "XYZ"'))
    assert main(["terms", "show", str(toml)]) == 1


def test_malformed_toml_names_the_problem(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = workdir / "bad.toml"
    bad.write_text('placement_id = "x"\nrate_per_gpu_hour_minor = 1.5\n')
    assert main(["terms", "show", str(bad)]) == 2
    assert "FAIL" in capsys.readouterr().err
