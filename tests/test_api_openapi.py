"""The API against its OpenAPI 3.1 document (``ledger/openapi.py``), checked by a
property-based API tester (schemathesis): generated requests, signed with a party's key
(SPEC §13), sent over real HTTP on 127.0.0.1; every answer's status, content type and
body must be ones the document describes, and none a server error."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
import structlog
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_ledger_scenario import build_scenario, local_service, publish_scenario_local

from ledger.access import Access
from ledger.http import LedgerApi, LedgerHttpServer
from ledger.openapi import OPENAPI
from proto.httpsig import sign_url
from proto.keys import SigningKey

schema = schemathesis.openapi.from_dict(OPENAPI)
_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class _Signed(requests.auth.AuthBase):
    """Signs each prepared request with a party's key (RFC 9421, proto/httpsig.py)."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        body = r.body if isinstance(r.body, bytes) else (r.body or "").encode()
        method = str(r.method)
        if method == "POST" and r.body is None:
            r.prepare_body(b"", None)
        for name, value in sign_url(self.key, method, str(r.url), body, int(time.time())).items():
            r.headers[name] = value
        return r


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, requests.Session]]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tmp = tmp_path_factory.mktemp("openapi")
    scenario = build_scenario("oas", placements=1, nodes=1, events=3)
    publish_scenario_local(tmp / "spool", scenario.inputs)
    service = local_service(tmp, scenario)
    service.run_until_idle()
    access = Access(
        service.store, scenario.cast.ledger.public_key, clock_s=lambda: int(time.time())
    )
    server = LedgerHttpServer(
        LedgerApi(service.store, service.key, service.metrics, access=access), "127.0.0.1", 0
    )
    server.start()
    session = requests.Session()
    session.auth = _Signed(scenario.cast.buyer)
    try:
        yield server.url, session
    finally:
        session.close()
        server.stop()
        service.close()
        structlog.reset_defaults()


def test_the_api_serves_its_openapi_document(api: tuple[str, requests.Session]) -> None:
    with urllib.request.urlopen(f"{api[0]}/openapi.json", timeout=30) as reply:
        served: dict[str, Any] = json.loads(reply.read())
    assert served == json.loads(json.dumps(OPENAPI))
    assert served["openapi"].startswith("3.1")
    # The tester's session signs: the buyer's own placement is listed to it.
    listed = api[1].get(f"{api[0]}/placements", timeout=30)
    assert listed.status_code == 200 and listed.json()["placements"][0]["roles"] == ["buyer"]
    assert requests.get(f"{api[0]}/placements", timeout=30).status_code == 401


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_one_the_document_describes(
    case: Any, api: tuple[str, requests.Session]
) -> None:
    base, session = api
    response = case.call(base_url=base, session=session)
    case.validate_response(response, checks=_CHECKS)
