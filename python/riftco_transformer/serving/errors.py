"""The failures the serving layer adds to Python's own categories.

Each subclasses the built-in category a caller would catch anyway (a request that can never
fit is a ``ValueError``; a full queue or a closed scheduler is a ``RuntimeError``), so code
that does not know these classes still handles them sensibly. The HTTP layer maps them to
status codes (``serving.http``).
"""

from __future__ import annotations


class RequestRejectedError(ValueError):
    """The request can never be served: its worst-case KV pages exceed the whole pool (or a
    group of requests cannot run at once). ``param`` names the request field to blame when
    it is not the prompt's length (``"n"`` for a group), else None."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PoolFullError(RuntimeError):
    """The KV pool cannot hold the request now; it fits once running requests finish.

    The scheduler never lets this reach a client (it queues the request instead); an engine
    raises it from ``open_stream`` when asked to open a stream that ``admission`` says must
    wait.
    """


class QueueFullError(RuntimeError):
    """The scheduler's bounded queue of waiting requests is full; retry later."""


class RequestCancelledError(RuntimeError):
    """The request was cancelled (``RequestHandle.cancel()``, e.g. a disconnected client)."""


class SchedulerClosedError(RuntimeError):
    """The scheduler was closed before (or while) serving the request."""
