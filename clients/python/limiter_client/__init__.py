"""Python client of the limiter: per-user caps on concurrent streams.

Acquire a Lease before a stream, watch ``lease.lost`` while it runs,
release it after (a ``with`` block does)::

    from limiter_client import Client, LimitReached

    with Client("http://limiter:8080") as limits:
        try:
            with limits.acquire("user-42", "paid", label="pod-7") as lease:
                for chunk in stream():
                    if lease.lost.is_set():
                        break  # expired, or released by support
                    send(chunk)
        except LimitReached as err:
            refuse(err.used, err.limit, err.retry_after)

Standard library only. The request and response bodies (limiter_client.schemas)
are generated from the service's api/openapi.yaml.
"""

from .admin import Admin
from .client import Client
from .errors import (
    ClientClosed,
    InvalidRequest,
    LimiterError,
    LimitReached,
    NotSlotHolder,
    PlanNotAllowed,
    PoolLimitReached,
    ProtocolError,
    SlotLost,
    Unauthenticated,
    Unavailable,
    UnknownPlan,
    UnknownPool,
)
from .lease import Lease
from .schemas import ErrorCode

__all__ = [
    "Admin",
    "Client",
    "ClientClosed",
    "ErrorCode",
    "InvalidRequest",
    "Lease",
    "LimitReached",
    "LimiterError",
    "NotSlotHolder",
    "PlanNotAllowed",
    "PoolLimitReached",
    "ProtocolError",
    "SlotLost",
    "Unauthenticated",
    "Unavailable",
    "UnknownPlan",
    "UnknownPool",
]

__version__ = "0.1.0"
