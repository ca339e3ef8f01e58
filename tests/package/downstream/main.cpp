// A consumer of the installed package: [2,3] x [3,2] on the CPU backend.
#include <iostream>

#include <riftco_transformer/core/tensor_ops.hpp>

int main() {
    using riftco_transformer::Tensor;
    const Tensor left({2, 3}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F});
    const Tensor right({3, 2}, {7.0F, 8.0F, 9.0F, 10.0F, 11.0F, 12.0F});
    const Tensor product = riftco_transformer::tensor_ops::matmul(left, right);
    for (const float value : product.to_host()) {
        std::cout << value << ' ';
    }
    std::cout << '\n';
    return 0;
}
