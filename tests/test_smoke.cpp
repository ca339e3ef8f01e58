// The smallest end-to-end check: the seed's matmul example on the CPU backend.
#include <gtest/gtest.h>

#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {

TEST(Smoke, SeedMatmulExample) {
    const Tensor left({2, 3}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F});
    const Tensor right({3, 2}, {7.0F, 8.0F, 9.0F, 10.0F, 11.0F, 12.0F});
    const Tensor product = tensor_ops::matmul(left, right);
    EXPECT_EQ(product.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(product, {58.0, 64.0, 139.0, 154.0}));
}

}  // namespace riftco_transformer
