"""Helpers shared by the test modules (imported as ``support``; pytest puts this directory on
``sys.path``)."""

from __future__ import annotations

import pytest

from riftco_transformer import RiftcoTransformerError


def native_error(call) -> RiftcoTransformerError:
    """The RiftcoTransformerError that ``call()`` raises (the test fails if it raises none)."""
    with pytest.raises(RiftcoTransformerError) as caught:
        call()
    return caught.value
