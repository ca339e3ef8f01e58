"""Contexts and tensors: construction, shapes, values, matmul, and their error contracts."""

from __future__ import annotations

import re
import struct

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    Context,
    RiftcoTransformerError,
    Tensor,
)


def test_from_data_keeps_shape_and_values_row_major(context):
    with Tensor.from_data(context, (2, 3), [1, 2, 3, 4, 5, 6]) as tensor:
        assert tensor.shape == (2, 3)
        assert tensor.rank == 2
        assert tensor.numel == 6
        assert tensor.backend == "cpu"
        assert tensor.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_values_may_be_nested_exactly_like_the_shape(context):
    with Tensor.from_data(context, [2, 2], [[1.5, 2], (3, 4)]) as tensor:
        assert tensor.tolist() == [1.5, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="nested as"):
        Tensor.from_data(context, (3, 2), [[1, 2, 3], [4, 5, 6]])


def test_ragged_or_mixed_nesting_is_a_value_error(context):
    with pytest.raises(ValueError, match="rectangular"):
        Tensor.from_data(context, (2, 2), [[1, 2], [3]])
    with pytest.raises(ValueError, match="rectangular"):
        Tensor.from_data(context, (2, 2), [[1, 2], 3])


def test_a_scalar_has_shape_unit_and_one_value(context):
    with Tensor.from_data(context, (), 2.5) as scalar:
        assert scalar.shape == ()
        assert scalar.rank == 0
        assert scalar.numel == 1
        assert scalar.tolist() == [2.5]
    with Tensor.from_data(context, (), [4.0]) as scalar:
        assert scalar.tolist() == [4.0]


def test_zeros_fills_the_shape_with_zeros(context):
    with Tensor.zeros(context, (3, 1, 2)) as tensor:
        assert tensor.shape == (3, 1, 2)
        assert tensor.tolist() == [0.0] * 6


@pytest.mark.parametrize("values", [[1, True], ["1", 2], [1, None], b"\x00\x00\x80\x3f" * 2])
def test_values_that_are_not_real_numbers_are_a_type_error(context, values):
    with pytest.raises(TypeError):
        Tensor.from_data(context, (2,), values)


def cyclic_at_depth_one() -> list:
    nest: list = []
    nest.append(nest)  # [[[...]]]
    return nest


def cyclic_at_depth_two() -> list:
    nest: list = [[0.0]]
    nest[0][0] = nest  # [[[[...]]]]
    return nest


def cyclic_through_a_tuple() -> list:
    nest: list = [0.0]
    nest[0] = (nest,)  # [([...],)]
    return nest


@pytest.mark.parametrize(
    ("make", "depth"),
    [(cyclic_at_depth_one, 1), (cyclic_at_depth_two, 2), (cyclic_through_a_tuple, 2)],
    ids=["depth-1", "depth-2", "through-a-tuple"],
)
def test_values_that_contain_themselves_are_a_value_error(context, make, depth):
    values = make()
    message = f"values contains itself (the list at depth {depth} also encloses it)"
    with pytest.raises(ValueError, match=re.escape(message)):
        Tensor.from_data(context, (1,), values)
    with Tensor.from_data(context, (1,), [1.0]) as tensor:  # the context is intact
        assert tensor.tolist() == [1.0]


def test_rows_shared_by_reference_are_not_a_cycle(context):
    row = [1.0, 2.0]
    with Tensor.from_data(context, (3, 2), [row, row, row]) as tensor:
        assert tensor.tolist() == [1.0, 2.0] * 3


def nested(value: float, depth: int):
    for _ in range(depth):
        value = [value]
    return value


def test_values_may_nest_64_levels_but_not_65(context):
    with Tensor.from_data(context, (1,) * 64, nested(2.0, 64)) as tensor:
        assert tensor.shape == (1,) * 64 and tensor.tolist() == [2.0]
    with pytest.raises(ValueError, match="values is nested more than 64 levels deep"):
        Tensor.from_data(context, (1,) * 65, nested(2.0, 65))


# The largest finite float32, from its bit pattern 0x7f7fffff (independent of the package).
FLOAT32_MAX = struct.unpack("<f", bytes.fromhex("ffff7f7f"))[0]
# The midpoint between FLOAT32_MAX and the next power of two, 2**128: values from it up round
# to inf in float32 (round half to even), values below it round to FLOAT32_MAX.
FLOAT32_OVERFLOW_THRESHOLD = (FLOAT32_MAX + 2.0**128) / 2


@pytest.mark.parametrize(
    ("shape", "values", "element"),
    [
        ((1,), [1e39], "values[0] = 1e+39"),
        ((2,), [1.0, -1e39], "values[1] = -1e+39"),
        ((2, 2), [[1, 2], [3, -1e39]], "values[1][1] = -1e+39"),
        ((), 1e39, "values = 1e+39"),
        ((1,), [FLOAT32_OVERFLOW_THRESHOLD], "values[0] = 3.4028235677973366e+38"),
        ((2,), [1, 10**39], "values[1] = ~1.000e+39 (an int)"),
        ((2,), [1, 10**400], "values[1] = ~1.000e+400 (an int)"),  # beyond float64 too
        ((1,), [-(10**5000)], "values[0] = -~1.000e+5000 (an int)"),  # beyond str()'s limit
    ],
)
def test_finite_values_beyond_float32_are_a_value_error_naming_the_element(
    context, shape, values, element
):
    with pytest.raises(ValueError, match=re.escape(f"{element} does not fit in float32")):
        Tensor.from_data(context, shape, values)


def test_values_up_to_the_float32_rounding_threshold_and_infinities_pass(context):
    just_below = FLOAT32_OVERFLOW_THRESHOLD - 2.0**75  # one float64 ulp (2**75 near 2**127)
    values = [just_below, -FLOAT32_MAX, float("inf"), float("-inf")]
    with Tensor.from_data(context, (4,), values) as tensor:
        assert tensor.tolist() == [FLOAT32_MAX, -FLOAT32_MAX, float("inf"), float("-inf")]


@pytest.mark.parametrize(
    ("shape", "error"),
    [
        ((2, 0), ValueError),
        ((-1, 2), ValueError),
        ((2, True), TypeError),
        ((2.0, 1), TypeError),
        (2, TypeError),
        ("22", TypeError),
        ((1 << 64,), ValueError),
    ],
)
def test_a_shape_must_be_a_tuple_of_positive_ints(context, shape, error):
    with pytest.raises(error):
        Tensor.zeros(context, shape)


def test_a_value_count_that_differs_from_the_shape_is_a_native_invalid_argument(context):
    with pytest.raises(RiftcoTransformerError) as caught:
        Tensor.from_data(context, (2, 3), [1, 2, 3, 4, 5])
    assert caught.value.status == STATUS_INVALID_ARGUMENT


def test_matmul_of_non_square_matrices_matches_hand_computed_values(context):
    with (
        Tensor.from_data(context, (2, 3), [1, 2, 3, 4, 5, 6]) as left,
        Tensor.from_data(context, (3, 2), [7, 8, 9, 10, 11, 12]) as right,
    ):
        with left.matmul(right) as product:
            # [1*7+2*9+3*11, 1*8+2*10+3*12, 4*7+5*9+6*11, 4*8+5*10+6*12]
            assert product.shape == (2, 2)
            assert product.tolist() == [58.0, 64.0, 139.0, 154.0]
        with left @ right as product:
            assert product.tolist() == [58.0, 64.0, 139.0, 154.0]


def test_batched_matmul_multiplies_each_batch_entry(context):
    left = Tensor.from_data(context, (2, 2, 3), [[[1, 2, 3], [4, 5, 6]], [[0, 1, 0], [2, 0, 2]]])
    right = Tensor.from_data(context, (2, 3, 1), [[[1], [0], [-1]], [[2], [3], [4]]])
    with left, right, left @ right as product:
        # batch 0: [1-3, 4-6]; batch 1: [3, 2*2+2*4]
        assert product.shape == (2, 2, 1)
        assert product.tolist() == [-2.0, -2.0, 3.0, 12.0]


def test_a_tensor_may_multiply_itself(context):
    with Tensor.from_data(context, (2, 2), [1, 2, 3, 4]) as square, square @ square as product:
        assert product.tolist() == [7.0, 10.0, 15.0, 22.0]


def test_mismatched_inner_dimensions_are_a_native_invalid_argument(context):
    with Tensor.from_data(context, (2, 3), [0] * 6) as tensor:
        with pytest.raises(RiftcoTransformerError) as caught:
            tensor @ tensor
        assert caught.value.status == STATUS_INVALID_ARGUMENT
        assert "inner dimensions" in caught.value.detail


def test_matmul_needs_a_tensor(context):
    with Tensor.from_data(context, (1, 1), [2]) as tensor:
        with pytest.raises(TypeError):
            tensor.matmul([[2.0]])
        with pytest.raises(TypeError):
            tensor @ 2


def test_tensors_stay_valid_after_their_context_closes():
    context = Context("cpu")
    tensor = Tensor.from_data(context, (1, 2), [1, 2])
    context.close()
    with tensor, tensor @ Tensor.from_data(Context(), (2, 1), [3, 4]) as product:
        assert product.tolist() == [11.0]
        assert tensor.backend == "cpu"
    with pytest.raises(RuntimeError, match="Context is closed"):
        Tensor.zeros(context, (1,))


def test_tensors_have_no_public_constructor():
    with pytest.raises(TypeError, match="from_data"):
        Tensor()


def test_from_data_needs_a_context():
    with pytest.raises(TypeError):
        Tensor.from_data("cpu", (1,), [1.0])
