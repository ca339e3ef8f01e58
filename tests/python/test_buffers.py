"""Bulk data crosses as buffers: round trips, zero-copy inputs, and the conversion rules."""

from __future__ import annotations

import ctypes
import re
import warnings
from array import array

import pytest

from riftco_transformer import Tensor
from riftco_transformer.native._buffers import float32_input, token_ids

MILLION = 1_000_000


def ramp(count: int) -> array:
    """0, 1, 2, ... as float32 (every value below 2**24 is exact in float32)."""
    return array("f", range(count))


# ---- float32 inputs and outputs ------------------------------------------------------------


def test_a_million_floats_round_trip_through_array(context):
    values = ramp(MILLION)
    with Tensor.from_data(context, (1000, 1000), values) as tensor:
        assert tensor.to_array() == values


def test_a_million_floats_round_trip_through_a_list(context):
    values = [float(index) for index in range(MILLION)]
    with Tensor.from_data(context, (MILLION,), values) as tensor:
        assert tensor.tolist() == values


def test_a_million_floats_round_trip_through_writable_and_read_only_memoryviews(context):
    values = ramp(MILLION)
    read_only = memoryview(values.tobytes()).cast("f")
    assert read_only.readonly
    for source in (memoryview(values), read_only):
        with Tensor.from_data(context, (MILLION,), source) as tensor:
            destination = array("f", bytes(4 * MILLION))
            tensor.copy_to(memoryview(destination))
            assert destination == values


def test_a_writable_float32_buffer_is_passed_without_a_copy():
    values = ramp(16)
    converted = float32_input(values, "values").values
    assert ctypes.addressof(converted) == values.buffer_info()[0]


def test_a_strided_buffer_is_copied_in_logical_order(context):
    values = ramp(10)
    with Tensor.from_data(context, (5,), memoryview(values)[::2]) as tensor:
        assert tensor.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("source", [array("d", [1.0, 2.0]), bytes(8), bytearray(8), "ab"])
def test_buffers_of_other_element_types_are_a_type_error(context, source):
    with pytest.raises(TypeError):
        Tensor.from_data(context, (2,), source)


def test_copy_to_checks_the_destination_and_writes_nothing_on_error(context):
    with Tensor.from_data(context, (3,), [1, 2, 3]) as tensor:
        destination = array("f", [9.0] * 4)
        with pytest.raises(ValueError, match="exactly 3"):
            tensor.copy_to(destination)
        assert destination == array("f", [9.0] * 4)
        with pytest.raises(TypeError, match="float32"):
            tensor.copy_to(array("d", [0.0] * 3))
        with pytest.raises(TypeError, match="writable"):
            tensor.copy_to(memoryview(bytes(12)).cast("f"))
        with pytest.raises(TypeError):
            tensor.copy_to([0.0, 0.0, 0.0])


def test_to_array_returns_an_independent_resizable_array(context):
    with Tensor.from_data(context, (2,), [1, 2]) as tensor:
        values = tensor.to_array()
    values.append(3.0)
    assert values == array("f", [1, 2, 3])


def test_numpy_missing_is_a_clear_import_error(run_python):
    result = run_python(
        "import sys\n"
        "sys.modules['numpy'] = None  # makes `import numpy` fail\n"
        "from riftco_transformer import Context, Tensor\n"
        "with Context() as context, Tensor.zeros(context, (2,)) as tensor:\n"
        "    print(tensor.to_array().tolist())\n"
        "    try:\n"
        "        tensor.numpy()\n"
        "    except ImportError as error:\n"
        "        print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    listed, message = result.stdout.splitlines()
    assert listed == "[0.0, 0.0]"
    assert "needs numpy" in message and "to_array()" in message


# ---- numpy (optional) ----------------------------------------------------------------------


def test_a_million_floats_round_trip_through_numpy(context):
    numpy = pytest.importorskip("numpy")
    values = numpy.arange(MILLION, dtype=numpy.float32).reshape(1000, 1000)
    with Tensor.from_data(context, (1000, 1000), values) as tensor:
        result = tensor.numpy()
        assert result.dtype == numpy.float32 and result.shape == (1000, 1000)
        assert numpy.array_equal(result, values)
        destination = numpy.empty((1000, 1000), dtype=numpy.float32)
        tensor.copy_to(destination)
        assert numpy.array_equal(destination, values)


def test_a_float32_c_contiguous_numpy_array_is_passed_without_a_copy():
    numpy = pytest.importorskip("numpy")
    values = numpy.ones((4, 4), dtype=numpy.float32)
    converted = float32_input(values, "values").values
    assert ctypes.addressof(converted) == values.__array_interface__["data"][0]


def test_a_read_only_numpy_array_is_passed_without_a_copy_and_kept_alive(context):
    numpy = pytest.importorskip("numpy")
    values = numpy.arange(16, dtype=numpy.float32).reshape(4, 4)
    values.flags.writeable = False
    address = values.__array_interface__["data"][0]
    converted = float32_input(values, "values").values
    assert ctypes.addressof(converted) == address
    del values  # the ctypes view keeps the array (and its memory) alive
    assert list(converted) == [float(index) for index in range(16)]
    frozen = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    frozen.flags.writeable = False
    with Tensor.from_data(context, (2, 3), frozen) as tensor:
        assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda numpy: numpy.arange(6, dtype=numpy.float64).reshape(2, 3), [0, 1, 2, 3, 4, 5]),
        (lambda numpy: numpy.arange(6, dtype=numpy.int64).reshape(2, 3), [0, 1, 2, 3, 4, 5]),
        (
            lambda numpy: numpy.asfortranarray(numpy.arange(6, dtype=numpy.float32).reshape(2, 3)),
            [0, 1, 2, 3, 4, 5],
        ),
        (lambda numpy: numpy.arange(12, dtype=numpy.float32)[::2], [0, 2, 4, 6, 8, 10]),
    ],
    ids=["float64", "int64", "fortran-order", "strided"],
)
def test_other_numpy_layouts_and_dtypes_are_converted_once(context, make, expected):
    numpy = pytest.importorskip("numpy")
    with Tensor.from_data(context, (2, 3), make(numpy)) as tensor:
        assert tensor.tolist() == [float(value) for value in expected]


@pytest.mark.parametrize(
    ("shape", "make", "element"),
    [
        ((2,), lambda numpy: numpy.array([1.0, 1e39]), "values[1] = 1e+39"),
        ((2, 2), lambda numpy: numpy.array([[1.0, 2.0], [-1e39, 3.0]]), "values[1][0] = -1e+39"),
        ((), lambda numpy: numpy.array(1e39), "values = 1e+39"),
        ((2, 1), lambda numpy: numpy.array([[1e39, 0.0]]).T, "values[0][0] = 1e+39"),  # strided
    ],
    ids=["flat", "nested", "zero-d", "transposed"],
)
def test_finite_numpy_floats_beyond_float32_are_a_value_error_not_a_warning(
    context, shape, make, element
):
    numpy = pytest.importorskip("numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" would fail here
        with pytest.raises(ValueError, match=re.escape(f"{element} does not fit in float32")):
            Tensor.from_data(context, shape, make(numpy))
    with Tensor.from_data(context, (1,), numpy.array([1.0])) as tensor:  # context intact
        assert tensor.tolist() == [1.0]


def test_numpy_infinities_and_the_float32_range_convert_without_a_warning(context):
    numpy = pytest.importorskip("numpy")
    largest = float(numpy.finfo(numpy.float32).max)
    values = numpy.array([largest, -largest, numpy.inf, -numpy.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Tensor.from_data(context, (4,), values) as tensor:
            assert tensor.tolist() == [largest, -largest, float("inf"), float("-inf")]
        big_integers = numpy.array([2**63 - 1], dtype=numpy.int64)  # ints never overflow float32
        with Tensor.from_data(context, (1,), big_integers) as tensor:
            assert tensor.tolist() == [float(2**63)]


def test_boolean_and_object_numpy_arrays_are_a_type_error(context):
    numpy = pytest.importorskip("numpy")
    for source in (numpy.ones(2, dtype=bool), numpy.array([1.0, None])):
        with pytest.raises(TypeError):
            Tensor.from_data(context, (2,), source)


def test_numpy_returns_the_tensor_shape_including_scalars(context):
    pytest.importorskip("numpy")
    with Tensor.from_data(context, (), 3.0) as scalar:
        assert scalar.numpy().shape == ()
        assert float(scalar.numpy()) == 3.0


# ---- token ids -----------------------------------------------------------------------------


def test_a_flat_row_of_ids_has_shape_time():
    converted = token_ids([1, 2, 3], "tokens")
    assert converted.shape == (3,)
    assert list(converted.values) == [1, 2, 3]


def test_a_batch_may_mix_lists_and_uint32_arrays():
    converted = token_ids([[1, 2], array("I", [3, 4]), (5, 6)], "tokens")
    assert converted.shape == (3, 2)
    assert list(converted.values) == [1, 2, 3, 4, 5, 6]


def test_a_uint32_array_row_is_passed_without_a_copy():
    row = array("I", [7, 8, 9])
    assert ctypes.addressof(token_ids(row, "tokens").values) == row.buffer_info()[0]


def test_other_integer_arrays_are_converted_with_range_checks():
    assert list(token_ids(array("q", [0, 2**32 - 1]), "tokens").values) == [0, 2**32 - 1]
    with pytest.raises(ValueError):
        token_ids(array("q", [-1]), "tokens")


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        ([1, -1], ValueError),
        ([1, 2**32], ValueError),
        ([1, 2.0], TypeError),
        ([1, True], TypeError),
        ("abc", TypeError),
        (b"abc", TypeError),
        ([[1, 2], [3]], ValueError),
        ([[1, 2], "ab"], TypeError),
        (array("f", [1.0]), TypeError),
        (iter([1, 2]), TypeError),
    ],
)
def test_ids_must_be_ints_in_uint32_range_in_a_rectangular_shape(tokens, error):
    with pytest.raises(error):
        token_ids(tokens, "tokens")


def test_numpy_integer_arrays_of_rank_one_or_two_are_accepted():
    numpy = pytest.importorskip("numpy")
    batch = numpy.arange(6, dtype=numpy.uint32).reshape(2, 3)
    converted = token_ids(batch, "tokens")
    assert converted.shape == (2, 3)
    assert ctypes.addressof(converted.values) == batch.__array_interface__["data"][0]
    assert list(token_ids(numpy.array([4, 5], dtype=numpy.int64), "tokens").values) == [4, 5]
    rows = token_ids([numpy.array([1, 2], dtype=numpy.uint16), [3, 4]], "tokens")
    assert rows.shape == (2, 2) and list(rows.values) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda numpy: numpy.zeros((1, 1, 1), dtype=numpy.uint32), ValueError),
        (lambda numpy: numpy.array([-1, 2]), ValueError),
        (lambda numpy: numpy.array([2**32], dtype=numpy.uint64), ValueError),
        (lambda numpy: numpy.array([1.0, 2.0]), TypeError),
        (lambda numpy: numpy.array([True, False]), TypeError),
    ],
)
def test_numpy_ids_of_other_ranks_ranges_or_dtypes_are_rejected(make, error):
    numpy = pytest.importorskip("numpy")
    with pytest.raises(error):
        token_ids(make(numpy), "tokens")
