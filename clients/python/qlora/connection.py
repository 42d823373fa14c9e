"""How the client reaches the coordinator: the address, TLS and bearer token, from arguments or
from the environment variables qloractl reads (cli/client.cc, common/rpc/coordinator_channel.h):

    QLORA_ADDRESS                   host:port (default 127.0.0.1:50051)
    QLORA_TLS=1                     TLS with the system's CA roots
    QLORA_TLS_CA                    TLS, checking the coordinator against this CA (PEM)
    QLORA_TLS_CERT, QLORA_TLS_KEY   a client certificate and its key, for mutual TLS
    QLORA_TLS_SERVER_NAME           the name the coordinator's certificate must carry
    QLORA_TOKEN_FILE, QLORA_TOKEN   a bearer token: the file's text, else the variable's value

An argument given replaces its variable. The token goes with every call as
`authorization: Bearer <token>`, as qloractl sends it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Union

import grpc

from qlora.errors import QloraError

DEFAULT_ADDRESS = "127.0.0.1:50051"
PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass(frozen=True)
class Connection:
    """A channel to the coordinator and the metadata every call carries."""

    address: str
    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]


def _read(path: PathLike, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise QloraError("INVALID_ARGUMENT", f"{what} {os.fspath(path)}: {e.strerror}") from e


def _pem(path: PathLike, what: str) -> bytes:
    data = _read(path, f"TLS {what}")
    if b"-----BEGIN " not in data:
        raise QloraError("INVALID_ARGUMENT", f"TLS {what} {os.fspath(path)} is not a PEM file")
    return data


def _token(token: Optional[str], token_file: Optional[PathLike], env: Mapping[str, str]) -> str:
    if token is not None:
        return token
    file = token_file if token_file is not None else env.get("QLORA_TOKEN_FILE", "")
    if not file:
        return env.get("QLORA_TOKEN", "")
    text = _read(file, "token file").decode("utf-8").strip()
    if not text:
        raise QloraError("INVALID_ARGUMENT", f"token file {os.fspath(file)} is empty")
    return text


def open_connection(address: Optional[str] = None, *, token: Optional[str] = None,
                    token_file: Optional[PathLike] = None, tls: Optional[bool] = None,
                    tls_ca: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
                    tls_key: Optional[PathLike] = None, tls_server_name: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None) -> Connection:
    """A connection from the arguments, each falling back to its variable in `env` (default
    os.environ). TLS is on when asked (tls=True, QLORA_TLS=1) or when a CA or client
    certificate is given. INVALID_ARGUMENT naming the file when a PEM or token file cannot be
    read, or a certificate comes without its key."""
    env = os.environ if env is None else env
    address = address or env.get("QLORA_ADDRESS") or DEFAULT_ADDRESS
    ca = tls_ca if tls_ca is not None else env.get("QLORA_TLS_CA", "")
    cert = tls_cert if tls_cert is not None else env.get("QLORA_TLS_CERT", "")
    key = tls_key if tls_key is not None else env.get("QLORA_TLS_KEY", "")
    server_name = tls_server_name if tls_server_name is not None else env.get("QLORA_TLS_SERVER_NAME", "")
    if tls is None:
        tls = env.get("QLORA_TLS") == "1"
    tls = tls or bool(ca) or bool(cert)
    bearer = _token(token, token_file, env)
    metadata = (("authorization", f"Bearer {bearer}"),) if bearer else ()
    if not tls:
        return Connection(address, grpc.insecure_channel(address), metadata)
    if bool(cert) != bool(key):
        raise QloraError("INVALID_ARGUMENT", "a TLS client certificate needs its key, and a key its certificate")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem(ca, "CA") if ca else None,
        private_key=_pem(key, "key") if key else None,
        certificate_chain=_pem(cert, "certificate") if cert else None)
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return Connection(address, grpc.secure_channel(address, credentials, options=options), metadata)
