"""The one error type of sandgym clients, carrying the platform's error code."""

import grpc

# gRPC statuses to sandgym codes, for a status without the sandgym-code metadata (the transport's own)
_CODE_OF_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_argument",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.ALREADY_EXISTS: "already_exists",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
    grpc.StatusCode.UNIMPLEMENTED: "unsupported",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "resource_exhausted",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.ABORTED: "divergence",
    grpc.StatusCode.DATA_LOSS: "step_in_doubt",
    grpc.StatusCode.UNAVAILABLE: "node_lost",
}


class SandgymError(Exception):
    """A failed call. `code` is what a program branches on (see docs/wire.md, "Errors");
    `retryable` says whether the same call may succeed later."""

    def __init__(self, code, message, retryable=False):
        super().__init__(message)
        self.code = code
        self.retryable = retryable

    def __repr__(self):
        return f"SandgymError({self.code!r}, {str(self)!r}, retryable={self.retryable})"


def from_rpc_error(error):
    """The SandgymError a failed gRPC call comes to."""
    # pairs, from grpc's tuple of metadata and grpc.aio's Metadata alike (not a plain mapping)
    trailing = {key: value for key, value in (error.trailing_metadata() or ())}
    code = trailing.get("sandgym-code") or _CODE_OF_STATUS.get(error.code(), "platform_error")
    unreachable = error.code() == grpc.StatusCode.UNAVAILABLE and "sandgym-code" not in trailing
    retryable = trailing.get("sandgym-retryable") == "true" or unreachable
    return SandgymError(code, error.details() or str(error.code()), retryable)
