// Writes everything the PyTorch parity check needs (tests/oracle/torch_parity.py) as JSON:
// the reference tiny model's parameters, a batch, our logits and loss for both attention
// kinds, every parameter gradient, and the parameters after one Adam step.
//
//   riftco_model_oracle_dump OUTPUT.json

#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace {

using namespace riftco_transformer;

void write_floats(std::ostream& out, const std::vector<float>& values) {
    out << '[';
    for (std::size_t i = 0; i < values.size(); ++i) {
        out << (i == 0 ? "" : ",") << std::setprecision(9) << values[i];
    }
    out << ']';
}

void write_shape(std::ostream& out, const Shape& shape) {
    out << '[';
    for (std::size_t i = 0; i < shape.size(); ++i)
        out << (i == 0 ? "" : ",") << shape[i];
    out << ']';
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: riftco_model_oracle_dump OUTPUT.json\n";
        return 2;
    }
    const TransformerDimensions dims{.vocabulary_size = 27,
                                     .maximum_context = 16,
                                     .model_width = 32,
                                     .head_count = 4,
                                     .block_count = 2,
                                     .feed_forward_width = 64};
    const std::size_t batch = 2;
    const std::size_t time = 12;
    std::vector<std::uint32_t> tokens(batch * time);
    std::vector<std::uint32_t> targets(batch * time);
    std::mt19937 sampler(2024);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::uint32_t>(sampler() % 27);
        targets[i] = static_cast<std::uint32_t>(sampler() % 27);
    }
    std::mt19937 generator(1234);
    DecoderOnlyTransformer model(dims, generator);
    std::ofstream out(argv[1]);
    out << "{\"dimensions\":{\"V\":27,\"C\":16,\"D\":32,\"H\":4,\"N\":2,\"F\":64},";
    out << "\"batch\":" << batch << ",\"time\":" << time << ",\"tokens\":[";
    for (std::size_t i = 0; i < tokens.size(); ++i)
        out << (i ? "," : "") << tokens[i];
    out << "],\"targets\":[";
    for (std::size_t i = 0; i < targets.size(); ++i)
        out << (i ? "," : "") << targets[i];
    out << "],\"parameters\":[";
    const ParameterList parameters = model.parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        out << (i ? "," : "") << "{\"name\":\"" << parameters[i].name << "\",\"shape\":";
        write_shape(out, parameters[i].parameter.shape());
        out << ",\"value\":";
        write_floats(out, parameters[i].parameter.value().to_host());
        out << '}';
    }
    out << "],\"runs\":{";
    for (const auto kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        model.set_attention(kind);
        Variable logits = model.forward(tokens, {batch, time});
        Variable loss = cross_entropy(logits, targets);
        loss.backward();
        out << (kind == AttentionKind::Flash ? "," : "") << '"'
            << (kind == AttentionKind::Flash ? "flash" : "materialized")
            << "\":{\"loss\":" << std::setprecision(9) << loss.value().item() << ",\"logits\":";
        write_floats(out, logits.value().to_host());
        out << ",\"gradients\":[";
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            if (i)
                out << ',';
            write_floats(out, parameters[i].parameter.gradient().to_host());
        }
        out << "]}";
    }
    // One Adam step (lr 1e-2, otherwise defaults: betas 0.9/0.999, eps 1e-8, clip 1.0) from
    // the flash run's gradients (the gradients of the last backward).
    AdamOptions options;
    options.learning_rate = 1e-2;
    Adam adam(parameters, options);
    const AdamStepStats stats = adam.step();
    out << "},\"adam\":{\"learning_rate\":0.01,\"gradient_norm\":" << std::setprecision(17)
        << stats.gradient_norm << ",\"parameters\":[";
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        if (i)
            out << ',';
        write_floats(out, parameters[i].parameter.value().to_host());
    }
    out << "]}}\n";
    return out ? 0 : 1;
}
