"""docker-compose.yml, checked without a Docker engine.

The structure is checked with PyYAML; `docker compose config` (or `docker-compose
config`) is run too when a client that can do it offline is installed.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.kafka_fetch import KAFKA_VERSION

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
TOPIC = "gridledger.records"
APP_SERVICES = ("ledger", "meter-a", "meter-b")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    assert "version" not in data  # obsolete in the Compose Specification
    return data


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services = compose["services"]
    assert isinstance(services, dict)
    return services


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _volume_entries(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            source, target = entry.split(":")[:2]
        else:
            source, target = entry.get("source", ""), entry["target"]
        out.append((source, target))
    return out


def test_services_present(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in ("kafka", "kafka-init", *APP_SERVICES):
        assert name in services, name


def test_kafka_is_apache_kafka_4_kraft_with_infinite_retention(compose: dict[str, Any]) -> None:
    kafka = _services(compose)["kafka"]
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka["image"]), kafka["image"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"  # same as the test broker
    env = _env(kafka)
    assert not any("ZOOKEEPER" in key for key in env)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    voters = env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
    assert voters.startswith(f"{node_id}@") or env.get("KAFKA_CONTROLLER_QUORUM_BOOTSTRAP_SERVERS")
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = env["KAFKA_LISTENERS"]
    assert f"{controller}://" in listeners
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for listener in listeners.split(","):
        assert listener.split("://")[0] in protocols, listener
    for advertised in env["KAFKA_ADVERTISED_LISTENERS"].split(","):
        assert advertised.split("://")[0] in protocols, advertised
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16
    assert int(env["KAFKA_LOG_RETENTION_MS"]) == -1
    assert int(env.get("KAFKA_LOG_RETENTION_BYTES", "-1")) == -1
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert "healthcheck" in kafka
    log_dir = env["KAFKA_LOG_DIRS"]
    assert any(target == log_dir for _, target in _volume_entries(kafka)), "data on a volume"


def test_topic_init_creates_the_records_topic(compose: dict[str, Any]) -> None:
    init = _services(compose)["kafka-init"]
    assert init["image"] == _services(compose)["kafka"]["image"]
    assert _depends_on(init) == {"kafka": "service_healthy"}
    assert init.get("restart", "no") == "no"
    command = [str(part) for part in init["command"]]
    assert "--create" in command and "--if-not-exists" in command
    assert command[command.index("--topic") + 1] == TOPIC
    assert int(command[command.index("--partitions") + 1]) >= 2
    configs = dict(
        command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--config"
    )
    from transport.kafka import replicated_topic_config

    # What the ledger demands of its topic (LogAppendTime: it refuses a CreateTime record,
    # ledger/consume.py), at this replication factor: the launcher's own settings.
    replicas = int(command[command.index("--replication-factor") + 1])
    assert configs == replicated_topic_config(replicas)
    assert configs["message.timestamp.type"] == "LogAppendTime"


def test_every_service_has_a_valid_image_or_build(compose: dict[str, Any]) -> None:
    for name, service in _services(compose).items():
        assert "build" in service or "image" in service, name
        if "image" in service:
            assert re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?", service["image"])
        if "build" in service:
            build = service["build"]
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            assert (context / (dockerfile or "Dockerfile")).is_file(), name


def test_app_services_run_the_stable_commands(compose: dict[str, Any], tmp_path: Path) -> None:
    services = _services(compose)
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
    assert re.search(r"pip install --constraint constraints\.txt \.", dockerfile)
    assert 'ENTRYPOINT ["gridledger"]' in dockerfile
    setup = services["setup"]
    assert setup["command"][0] == "example-setup" and "--publish" in setup["command"]
    assert _depends_on(setup) == {"kafka-init": "service_completed_successfully"}
    stack_dir = setup["command"][setup["command"].index("--out") + 1]
    bootstrap = setup["command"][setup["command"].index("--bootstrap") + 1]
    assert bootstrap == "kafka:9092"  # the compose network's listener
    ledger = services["ledger"]
    assert ledger["command"][:3] == ["ledger", "run", "--config"]
    for name in ("meter-a", "meter-b"):
        command = services[name]["command"]
        assert command[:3] == ["meter", "run", "--config"], name
    # What setup writes is what the services read: run it here and load every config with
    # the real parsers (paths in the configs are relative to the stack directory).
    from gridledger.cli import main
    from ledger.config import load_config
    from meter.config import load_meter_config
    from meter.sim import parse_sim_spec

    out = tmp_path / "stack"
    assert main(["example-setup", "--out", str(out), "--bootstrap", bootstrap]) == 0
    for name in APP_SERVICES:
        service = services[name]
        assert _depends_on(service) == {"setup": "service_completed_successfully"}, name
        assert ("stack", stack_dir) in _volume_entries(service), name
        config = service["command"][service["command"].index("--config") + 1]
        assert config.startswith(stack_dir + "/"), name
        local = out / config[len(stack_dir) + 1 :]
        if name == "ledger":
            ledger_config = load_config(local)
            assert ledger_config.kafka is not None
            assert ledger_config.kafka.settings.bootstrap == bootstrap
            assert ledger_config.key_file.is_file()
        else:
            meter_config = load_meter_config(local)
            assert meter_config.transport == "kafka" and meter_config.source == "simulate"
            assert meter_config.key_file.is_file()
            command = service["command"]
            if "--simulate" in command:
                parse_sim_spec(command[command.index("--simulate") + 1])
    # Running setup again keeps the keys and the placement (a restarted stack).
    before = sorted(p.name for p in (out / "terms").iterdir())
    key_before = (out / "keys" / "example-ledger.key").read_bytes()
    assert main(["example-setup", "--out", str(out), "--bootstrap", bootstrap]) == 0
    assert sorted(p.name for p in (out / "terms").iterdir()) == before
    assert (out / "keys" / "example-ledger.key").read_bytes() == key_before


def test_depends_on_volumes_and_ports(compose: dict[str, Any]) -> None:
    services = _services(compose)
    named_volumes = set((compose.get("volumes") or {}).keys())
    used_volumes = set()
    for name, service in services.items():
        for dep, condition in _depends_on(service).items():
            assert dep in services and dep != name, (name, dep)
            assert condition in {
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            }
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], dep
        for source, target in _volume_entries(service):
            assert target.startswith("/"), (name, target)
            if source.startswith((".", "/")):
                assert source.startswith("./"), f"{name}: bind mounts stay inside the repo"
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in named_volumes, f"{name}: volume {source} not declared"
                used_volumes.add(source)
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", (name, port)
            else:
                assert str(port).startswith("127.0.0.1:"), (name, port)
    assert used_volumes == named_volumes


def _compose_cli() -> list[str] | None:
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        try:
            done = subprocess.run(
                [*cli, "version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return cli
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` / `docker-compose` client installed")
    done = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


def test_the_example_stack_runs_for_real(
    tmp_path: Path, tmp_topic: Any, kafka_bootstrap: str
) -> None:
    """The files `setup` writes drive a real meter and ledger through the test broker."""
    import asyncio
    import os
    import sys

    from gridledger.cli import main
    from ledger.config import load_config
    from ledger.service import KafkaLedgerService
    from proto.terms import load_terms_file

    topic = tmp_topic(3)
    out = tmp_path / "stack"
    start_ms = 1_796_083_200_000
    args = ["example-setup", "--out", str(out), "--bootstrap", kafka_bootstrap]
    args += ["--topic", topic, "--start-ms", str(start_ms), "--hours", "1", "--http", "off"]
    assert main([*args, "--publish"]) == 0
    terms, _ = load_terms_file(next((out / "terms").iterdir()))
    # Both meters, as the compose services run them, on a simulated clock for 20 minutes.
    for name in ("meter-a", "meter-b"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gridledger",
                "meter",
                "run",
                "--config",
                str(out / f"{name}.toml"),
                "--simulate",
                "seed=3",
                "--until-ms",
                str(start_ms + 20 * 60_000),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr[-2000:]
    config = load_config(out / "ledger.toml")
    service = KafkaLedgerService.from_config(config, clock=lambda: start_ms + 20 * 60_000)

    async def run() -> None:
        await service.start()
        try:
            await service.run_until(deadline_s=60.0)
        finally:
            await service.stop()

    asyncio.run(run())
    try:
        head = service.store.head(terms.placement_id)
        assert head is not None
        # terms + 20 events from each of the two nodes, all accepted.
        assert head.chain_index == 40
        rejected = service.store.query("SELECT count(*) FROM records WHERE status = 'rejected'")
        assert rejected == [(0,)]
    finally:
        service.close()


# ---- profile "cluster": three brokers ------------------------------------------------------

CLUSTER_PROFILE = "cluster"
CLUSTER_BROKERS = ("kafka-1", "kafka-2", "kafka-3")
CLUSTER_APPS = ("ledger-cluster", "meter-cluster-a", "meter-cluster-b")


def _in_profile(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in _services(compose).items()
        if CLUSTER_PROFILE in service.get("profiles", [])
    }


def test_cluster_profile_is_apart_from_the_default_stack(compose: dict[str, Any]) -> None:
    """Nothing of the profile starts with a plain `docker compose up`, and it depends on
    nothing of the default stack (no shared broker, no shared stack volume)."""
    profile = _in_profile(compose)
    assert set(profile) == {
        *CLUSTER_BROKERS,
        "kafka-cluster-init",
        "setup-cluster",
        *CLUSTER_APPS,
    }
    default = {n for n, s in _services(compose).items() if not s.get("profiles")}
    assert {"kafka", "kafka-init", "setup", *APP_SERVICES} <= default
    for name, service in profile.items():
        assert not set(_depends_on(service)) & default, name
        for source, _ in _volume_entries(service):
            assert source not in ("kafka-data", "stack"), (name, source)
    host_ports = [
        str(p).split(":")[1] for s in _services(compose).values() for p in s.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports)), host_ports  # both stacks can run at once


def test_cluster_brokers_form_one_kraft_quorum_with_rf3_and_min_isr2(
    compose: dict[str, Any],
) -> None:
    services = _services(compose)
    envs = {name: _env(services[name]) for name in CLUSTER_BROKERS}
    node_ids = {name: env["KAFKA_NODE_ID"] for name, env in envs.items()}
    assert sorted(node_ids.values()) == ["1", "2", "3"]
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1  # one cluster
    cluster_id = next(iter(envs.values()))["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    assert cluster_id != _env(services["kafka"])["CLUSTER_ID"]  # not the single node's
    data_volumes = set()
    for name, env in envs.items():
        service = services[name]
        assert service["image"] == f"apache/kafka:{KAFKA_VERSION}", name
        assert service["hostname"] == name
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        # Every node names the same three voters: id@host:controller-port of each node.
        voters = dict(v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        assert voters == {node_ids[n]: f"{n}:9093" for n in CLUSTER_BROKERS}, name
        listeners = dict(
            item.split("://") for item in env["KAFKA_LISTENERS"].split(",")
        )  # name -> ":port"
        assert listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]] == ":9093", name
        protocols = dict(
            p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        )
        assert set(listeners) <= set(protocols), name
        advertised = dict(
            item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        )
        assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]] == f"{name}:9092", name
        host_port = advertised["HOST"].rsplit(":", 1)[1]
        assert listeners["HOST"] == f":{host_port}", name
        assert service["ports"] == [f"127.0.0.1:{host_port}:{host_port}"], name
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        for key in (
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        ):
            assert env[key] == "3", (name, key)
        for key in (
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
        ):
            assert env[key] == "2", (name, key)
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        assert int(env["KAFKA_LOG_RETENTION_MS"]) == -1
        assert int(env["KAFKA_LOG_RETENTION_BYTES"]) == -1
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        assert "healthcheck" in service, name
        sources = [s for s, target in _volume_entries(service) if target == env["KAFKA_LOG_DIRS"]]
        assert len(sources) == 1, name
        data_volumes.add(sources[0])
    assert len(data_volumes) == 3  # each broker keeps its own log


def test_cluster_topic_init_creates_the_replicated_records_topic(compose: dict[str, Any]) -> None:
    services = _services(compose)
    init = services["kafka-cluster-init"]
    assert init["image"] == services["kafka-1"]["image"]
    assert _depends_on(init) == dict.fromkeys(CLUSTER_BROKERS, "service_healthy")
    assert init.get("restart", "no") == "no"
    command = [str(part) for part in init["command"]]
    assert "--create" in command and "--if-not-exists" in command
    assert command[command.index("--topic") + 1] == TOPIC
    assert int(command[command.index("--partitions") + 1]) >= 2
    assert command[command.index("--replication-factor") + 1] == "3"
    bootstrap = command[command.index("--bootstrap-server") + 1].split(",")
    assert bootstrap == [f"{n}:9092" for n in CLUSTER_BROKERS]
    configs = dict(
        command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--config"
    )
    from transport.kafka import REPLICATION_FACTOR, replicated_topic_config

    # The same topic settings the launcher's cluster and the tests use.
    assert configs == replicated_topic_config(REPLICATION_FACTOR)


def test_cluster_apps_use_every_broker(compose: dict[str, Any], tmp_path: Path) -> None:
    """setup-cluster writes configs listing the three brokers; the real parsers load them;
    the ledger and the meters of the profile read what it writes, and run the same
    commands as the default stack's."""
    from gridledger.cli import main
    from ledger.config import load_config
    from meter.config import load_meter_config

    services = _services(compose)
    setup = services["setup-cluster"]
    assert _depends_on(setup) == {"kafka-cluster-init": "service_completed_successfully"}
    command = [str(part) for part in setup["command"]]
    assert command[0] == "example-setup" and "--publish" in command
    bootstrap = command[command.index("--bootstrap") + 1]
    assert bootstrap.split(",") == [f"{n}:9092" for n in CLUSTER_BROKERS]
    stack_dir = command[command.index("--out") + 1]
    out = tmp_path / "stack"
    assert main(["example-setup", "--out", str(out), "--bootstrap", bootstrap]) == 0
    for name, default in zip(CLUSTER_APPS, APP_SERVICES, strict=True):
        service = services[name]
        assert _depends_on(service) == {"setup-cluster": "service_completed_successfully"}
        assert ("stack-cluster", stack_dir) in _volume_entries(service), name
        assert service["command"] == services[default]["command"], name
        config = service["command"][service["command"].index("--config") + 1]
        local = out / config[len(stack_dir) + 1 :]
        if name == "ledger-cluster":
            ledger_config = load_config(local)
            assert ledger_config.kafka is not None
            assert ledger_config.kafka.settings.bootstrap == bootstrap
        else:
            meter_config = load_meter_config(local)
            assert meter_config.transport == "kafka" and meter_config.kafka is not None
            assert meter_config.kafka.bootstrap == bootstrap


DOCKERFILE = ROOT / "Dockerfile"
APP_UID = "10001"


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if pending.strip():
                joined.append(pending.strip())
            pending = ""
    return [(j.split(None, 1)[0].upper(), j.split(None, 1)[1]) for j in joined]


def test_meters_that_finish_their_window_stay_down(compose: dict[str, Any]) -> None:
    """A meter exits 0 once every window is over: restart only on failure (issue 18)."""
    services = _services(compose)
    for name in APP_SERVICES:
        assert services[name]["restart"] == "on-failure", name
    assert services["setup"]["restart"] == "no"


def test_volume_mount_points_exist_in_the_image_owned_by_the_app_user(
    compose: dict[str, Any],
) -> None:
    """A fresh named volume takes the owner of the image directory it mounts on: every app
    volume target is created in the image and owned by uid 10001, the user the services
    run as (issue 18: the `stack` volume was root-owned and `setup` could not write)."""
    instructions = _dockerfile_instructions()
    runs = " ".join(args for op, args in instructions if op == "RUN")
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1] in ("gridledger", APP_UID)
    assert f"--uid {APP_UID}" in runs
    created = set(re.findall(r"(/var/lib/gridledger[\w/.-]*)", runs.split("mkdir", 1)[1]))
    chowned = re.findall(r"chown -R (\S+) (/var/lib/gridledger)\b", runs)
    assert chowned and chowned[0][0] in (f"{APP_UID}:{APP_UID}", "gridledger:gridledger")
    services = _services(compose)
    targets = {
        target
        for name in ("setup", *APP_SERVICES)
        for source, target in _volume_entries(services[name])
        if not source.startswith((".", "/"))  # named volumes only
    }
    assert targets, "the app services mount the stack volume"
    for target in targets:
        assert target in created, f"{target} is not created in the image"
        assert target.startswith(chowned[0][1])


def test_the_image_copies_every_package_it_installs() -> None:
    """pip install . in the image needs every package pyproject.toml lists."""
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    copied = {
        args.split()[0].rstrip("/") for op, args in _dockerfile_instructions() if op == "COPY"
    }
    top = {p.split(".")[0] for p in packages}
    assert top <= copied, top - copied
