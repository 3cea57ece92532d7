"""The kubelet PodResources API v1 ``List``, over its local gRPC socket, without generated
stubs: the request is empty and the response is decoded here from the protobuf wire format
(only the fields ``meter.allocation.KubeletSource`` reads; every other field is skipped).

    service PodResourcesLister { rpc List(ListPodResourcesRequest)
                                     returns (ListPodResourcesResponse); }
    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources       { string name = 1; string namespace = 2;
                         repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; ... }

gRPC (``grpcio``) is an optional extra (``pip install gridledger[kubelet]``); without it,
``list_pod_resources`` raises a clear error and the source reads ``unknown``.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "DEFAULT_SOCKET",
    "LIST_METHOD",
    "MAX_RESPONSE_BYTES",
    "decode_list_response",
    "encode_list_response",
    "list_pod_resources",
]

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
_MAX_DEPTH: Final = 4


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise ValueError("varint longer than 10 bytes")


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of one message, as (number, bytes); others skipped."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("field runs past the message")
            out.append((number, data[pos : pos + length]))
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(data):
        raise ValueError("message ends inside a field")
    return out


def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


def decode_list_response(data: bytes) -> dict[str, Any]:
    """``ListPodResourcesResponse`` bytes as a mapping of its field names."""
    if len(data) > MAX_RESPONSE_BYTES:
        raise ValueError(f"response of {len(data)} bytes exceeds {MAX_RESPONSE_BYTES}")
    pods = []
    for number, pod_raw in _fields(data):
        if number != 1:
            continue
        pod: dict[str, Any] = {"name": "", "namespace": "", "containers": []}
        for n, raw in _fields(pod_raw):
            if n == 1:
                pod["name"] = _text(raw)
            elif n == 2:
                pod["namespace"] = _text(raw)
            elif n == 3:
                container: dict[str, Any] = {"name": "", "devices": []}
                for cn, craw in _fields(raw):
                    if cn == 1:
                        container["name"] = _text(craw)
                    elif cn == 2:
                        device: dict[str, Any] = {"resource_name": "", "device_ids": []}
                        for dn, draw in _fields(craw):
                            if dn == 1:
                                device["resource_name"] = _text(draw)
                            elif dn == 2:
                                device["device_ids"].append(_text(draw))
                        container["devices"].append(device)
                pod["containers"].append(container)
        pods.append(pod)
    return {"pod_resources": pods}


def _field(number: int, payload: bytes) -> bytes:
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def encode_list_response(response: dict[str, Any]) -> bytes:
    """The protobuf bytes of a ``ListPodResourcesResponse`` mapping (tests and fakes: what
    the kubelet sends)."""
    out = b""
    for pod in response.get("pod_resources", []):
        body = _field(1, pod["name"].encode()) + _field(2, pod["namespace"].encode())
        for container in pod.get("containers", []):
            c = _field(1, container["name"].encode())
            for device in container.get("devices", []):
                d = _field(1, device["resource_name"].encode())
                for device_id in device.get("device_ids", []):
                    d += _field(2, device_id.encode())
                c += _field(2, d)
            body += _field(3, c)
        out += _field(1, body)
    return out


def list_pod_resources(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> dict[str, Any]:
    """Call ``List`` on the kubelet's socket (needs the optional ``grpcio``)."""
    try:
        import grpc  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as exc:
        raise RuntimeError(
            "allocation = 'kubelet' needs grpcio: pip install 'gridledger[kubelet]'"
        ) from exc
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda _: b"",
            response_deserializer=lambda raw: raw,
        )
        raw = call(None, timeout=timeout_s)
    return decode_list_response(bytes(raw))
