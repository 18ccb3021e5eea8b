"""The wire under the client: gRPC with msgpack messages, as docs/wire.md describes."""

from __future__ import annotations

import asyncio
import os
from typing import Any, List, Optional, Tuple

import grpc
import grpc.aio
import msgpack

from .errors import SandgymError, from_rpc_error

# what a reply may be at most (the platform sends up to 96 MiB)
_MAX_MESSAGE_BYTES = 100 * 1024 * 1024


def _encode(value):
    return msgpack.packb(value, use_bin_type=True)


def _decode(data):
    return msgpack.unpackb(data, raw=False)


def parse_url(url: str) -> str:
    """`grpc://HOST:PORT` (or `HOST:PORT`) as the target gRPC dials."""
    target = url[len("grpc://"):] if url.startswith("grpc://") else url
    if "://" in target or ":" not in target:
        raise SandgymError("invalid_argument", f"{url!r} is not a sandgym address: use grpc://HOST:PORT")
    return target


def _read_pem(path, what):
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise SandgymError("invalid_argument", f"cannot read the TLS {what} {path}: {error}") from None


def tls_credentials(ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None) -> Any:
    """TLS to the server, from PEM file paths; defaults to $SANDGYM_TLS_CA, $SANDGYM_TLS_CERT and
    $SANDGYM_TLS_KEY. Returns None (plaintext) when no CA is given. The certificate and key are
    what a server that asks for mutual TLS checks."""
    ca = ca or os.environ.get("SANDGYM_TLS_CA")
    cert = cert or os.environ.get("SANDGYM_TLS_CERT")
    key = key or os.environ.get("SANDGYM_TLS_KEY")
    if not ca:
        return None
    if bool(cert) != bool(key):
        raise SandgymError("invalid_argument", "give the TLS certificate and its key together")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(ca, "CA certificate"),
        private_key=_read_pem(key, "key") if key else None,
        certificate_chain=_read_pem(cert, "certificate") if cert else None,
    )


_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    # a restarted node is back within seconds: do not back off for minutes
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _metadata_of(token: str, project: Optional[str]) -> List[Tuple[str, str]]:
    metadata = [("authorization", f"Bearer {token}")]
    if project:
        metadata.append(("sandgym-project", project))
    return metadata


class Wire:
    """One channel to a node agent or a controller; every call carries the token."""

    def __init__(self, url: str, token: str, project: Optional[str] = None, connect_timeout: float = 10.0, tls: Any = None) -> None:
        credentials = tls if tls is not None else tls_credentials()
        target = parse_url(url)
        self._channel = (
            grpc.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        )
        self._metadata = _metadata_of(token, project)
        self._methods: dict = {}
        self.wait_ready(connect_timeout)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Returns once the server is reachable; raises a retryable `node_lost` after `timeout`."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise SandgymError("node_lost", f"the server did not answer within {timeout} s", True) from None

    def _method(self, path):
        method = self._methods.get(path)
        if method is None:
            method = self._channel.unary_unary(path, request_serializer=_encode, response_deserializer=_decode)
            self._methods[path] = method
        return method

    def call(self, service: str, method: str, request: dict, timeout: Optional[float] = None) -> Any:
        """One unary call; a failure raises SandgymError."""
        try:
            return self._method(f"/sandgym.v1.{service}/{method}")(
                request, metadata=self._metadata, timeout=timeout
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def call_async(self, service, method, request, timeout=None):
        """A unary call in flight: `.result()` returns the reply or raises SandgymError."""
        future = self._method(f"/sandgym.v1.{service}/{method}").future(
            request, metadata=self._metadata, timeout=timeout
        )
        return _Pending(future)

    def close(self) -> None:
        self._channel.close()


class _Pending:
    def __init__(self, future):
        self._future = future

    def result(self):
        try:
            return self._future.result()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None


class AsyncWire:
    """One asyncio channel (grpc.aio) to a node agent or a controller: every call of a process's
    envs is multiplexed on it as HTTP/2 streams, with no thread per call. Made in the event loop
    that uses it (see `connect`)."""

    def __init__(self, url: str, token: str, project: Optional[str] = None, tls: Any = None) -> None:
        credentials = tls if tls is not None else tls_credentials()
        target = parse_url(url)
        self._channel = (
            grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        )
        self._metadata = tuple(_metadata_of(token, project))
        self._methods: dict = {}

    @classmethod
    async def connect(cls, url: str, token: str, project: Optional[str] = None, connect_timeout: float = 10.0, tls: Any = None) -> "AsyncWire":
        wire = cls(url, token, project, tls)
        try:
            await wire.wait_ready(connect_timeout)
        except BaseException:
            await wire.close()
            raise
        return wire

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Returns once the server is reachable; raises a retryable `node_lost` after `timeout`."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise SandgymError("node_lost", f"the server did not answer within {timeout} s", True) from None

    def _method(self, path: str) -> Any:
        method = self._methods.get(path)
        if method is None:
            method = self._channel.unary_unary(path, request_serializer=_encode, response_deserializer=_decode)
            self._methods[path] = method
        return method

    async def call(self, service: str, method: str, request: dict, timeout: Optional[float] = None) -> Any:
        """One unary call; a failure raises SandgymError."""
        try:
            return await self._method(f"/sandgym.v1.{service}/{method}")(
                request, metadata=self._metadata, timeout=timeout
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def close(self) -> None:
        await self._channel.close()
