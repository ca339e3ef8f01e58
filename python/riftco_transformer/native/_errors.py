"""Native failures as Python exceptions."""

from __future__ import annotations

from ._abi import STATUS_OK
from ._loader import library


class RiftcoTransformerError(RuntimeError):
    """A native call returned a status other than ``ok``.

    Attributes:
        status: the ``RT_STATUS_*`` code (an int; compare with the ``STATUS_*`` constants).
        status_name: its stable lower-case name, e.g. ``"invalid_argument"``.
        detail: the library's diagnostic for the failing call (copied right after it).

    ``str(error)`` is ``"status_name: detail"``.
    """

    def __init__(self, status: int, status_name: str, detail: str) -> None:
        super().__init__(f"{status_name}: {detail}")
        self.status = status
        self.status_name = status_name
        self.detail = detail


# Tracebacks name the class where users import it from.
RiftcoTransformerError.__module__ = "riftco_transformer"


def check_status(status: int) -> None:
    """Raise :class:`RiftcoTransformerError` when ``status`` is not ``ok``.

    Call it immediately after the native call, on the same thread and under the same lock:
    the diagnostic is the thread's last-error text, which the next status-returning call
    overwrites.
    """
    if status == STATUS_OK:
        return
    native = library()
    detail = native.rt_last_error().decode("utf-8", errors="replace")
    status_name = native.rt_status_string(status).decode("ascii", errors="replace")
    raise RiftcoTransformerError(status, status_name, detail)
