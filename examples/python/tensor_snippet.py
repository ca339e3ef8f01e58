from riftco_transformer import Context, Tensor, backend_available

backend = (
    "tpu"
    if backend_available("tpu")
    else "cuda"
    if backend_available("cuda")
    else "metal"
    if backend_available("metal")
    else "cpu"
)

with Context(backend) as context:
    with Tensor.from_data(
        context,
        (2, 3),
        [1, 2, 3, 4, 5, 6],
    ) as left:
        with Tensor.from_data(
            context,
            (3, 2),
            [7, 8, 9, 10, 11, 12],
        ) as right:
            with left @ right as product:
                print(product.shape)
                print(product.tolist())
