"""Checks of single Python arguments, done before any native call.

Division of labour with the C library: Python checks what belongs to one argument on its own
(its Python type, and the range its documented domain or C field type allows), so mistakes
surface as ``TypeError``/``ValueError`` at the call that made them. Rules that relate several
values, or a value to native state (a count against a shape, an id against a vocabulary, a
head count dividing a width), stay in the library and surface as
:class:`~riftco_transformer.native.RiftcoTransformerError`.
"""

from __future__ import annotations

import math
import numbers
import reprlib

UINT32_LIMIT = 1 << 32
UINT64_LIMIT = 1 << 64

_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60


def describe_value(value: object) -> str:
    """``value`` for an error message: its repr, shortened (a huge int as its magnitude).

    Never raises: an int too long for ``str`` (Python's digit limit) is shown as ``~1e+N``.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        exponent = math.log10(abs(value))
        mantissa = 10 ** (exponent - math.floor(exponent))
        sign = "-" if value < 0 else ""
        return f"{sign}~{mantissa:.3f}e+{math.floor(exponent)} (an int)"
    return _SHORT_REPR.repr(value)


def require_int(value: object, name: str, minimum: int, limit: int) -> int:
    """``value`` as an int in ``[minimum, limit)``.

    TypeError for a non-integer or a bool (a bool is almost always a mistake where a count
    is expected); ValueError when it is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an int, not {type(value).__name__} ({describe_value(value)})"
        )
    number = int(value)
    if not minimum <= number < limit:
        raise ValueError(f"{name} must be in [{minimum}, {limit}), got {describe_value(number)}")
    return number


def require_bool(value: object, name: str) -> bool:
    """``value`` when it is a bool (TypeError otherwise: 1 and "yes" are not flags)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def require_real(value: object, name: str) -> float:
    """``value`` as a float: TypeError for a non-real number or a bool, ValueError for an int
    too large for a float (beyond about 1.8e308)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, not {type(value).__name__} ({describe_value(value)})"
        )
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float, got {describe_value(value)}") from None


def require_positive_float(value: object, name: str, *, allow_infinity: bool = False) -> float:
    """``value`` as a float that is > 0 and finite (or +inf when ``allow_infinity``).

    TypeError for a non-real number or a bool; ValueError for zero, a negative value, NaN or
    a disallowed infinity.
    """
    number = require_real(value, name)
    finite_enough = math.isfinite(number) or (allow_infinity and number == math.inf)
    if not (number > 0 and finite_enough):
        bound = "positive (or inf)" if allow_infinity else "finite and positive"
        raise ValueError(f"{name} must be {bound}, got {number!r}")
    return number


def require_open_unit_interval(value: object, name: str) -> float:
    """``value`` as a float strictly between 0 and 1 (TypeError/ValueError otherwise)."""
    number = require_real(value, name)
    if not 0.0 < number < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {number!r}")
    return number


def require_choice(value: object, name: str, choices: dict[str, int]) -> int:
    """The ABI value of a policy given by name (``choices`` maps accepted names to values)."""
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a str, not {type(value).__name__} ({describe_value(value)})"
        )
    try:
        return choices[value]
    except KeyError:
        accepted = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{name} must be one of {accepted}, got {value!r}") from None


def shape_dimensions(shape: object, name: str = "shape") -> tuple[int, ...]:
    """A tensor shape as a tuple of positive ints (``()`` is a scalar)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints, not {type(shape).__name__}")
    return tuple(
        require_int(dimension, f"{name}[{axis}]", 1, UINT64_LIMIT)
        for axis, dimension in enumerate(shape)
    )
