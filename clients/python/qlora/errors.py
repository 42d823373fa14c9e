"""QloraError: the one exception the client raises, for the coordinator's refusals and for
input it refuses itself, so that a caller catches one type and branches on `code`."""
from __future__ import annotations

import grpc


class QloraError(Exception):
    """A failed call. `code` is a gRPC status code name (NOT_FOUND, INVALID_ARGUMENT,
    UNAUTHENTICATED, PERMISSION_DENIED, UNAVAILABLE, ...); `message` says what was wrong, in
    the coordinator's words where it refused."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def from_rpc_error(error: grpc.RpcError, address: str) -> QloraError:
    """`error` (raised by a stub call or stream) as a QloraError."""
    code = error.code().name if isinstance(error, grpc.Call) else "UNKNOWN"
    message = error.details() if isinstance(error, grpc.Call) else str(error)
    if code == "UNAVAILABLE":
        # As qloractl says it: the usual cause is a wrong address or a stopped coordinator.
        message = (f"nothing answered at {address}: is qlora-coordinator running there? "
                   f"Pass the address it listens on (or set QLORA_ADDRESS) ({message})")
    return QloraError(code, message or code)
