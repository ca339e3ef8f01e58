// riftco-char-mlp: a byte-level MLP language model (Bengio-style: the previous k bytes ->
// embeddings -> LayerNorm -> GELU hidden layer -> next-byte logits), trained on the bundled
// corpus with nothing but the engine's raw tensor ops. Forward and backward are written out
// by hand below, one line per op with its shapes, so the program doubles as a worked example
// of the raw-op layer that autograd will later automate.
//
//   riftco-char-mlp [--steps N] [--batch B] [--context K] [--embedding E] [--hidden H]
//                   [--learning-rate LR] [--seed S] [--sample-length L] [--temperature T]
//                   [--corpus-dir DIR]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "example_support.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace {

namespace ops = riftco_transformer::tensor_ops;
namespace examples = riftco_transformer::examples;
using riftco_transformer::Shape;
using riftco_transformer::Tensor;

constexpr std::size_t vocabulary = 256;  // bytes

struct Options {
    std::size_t steps = 2000;
    std::size_t batch = 256;
    std::size_t context = 6;
    std::size_t embedding = 24;
    std::size_t hidden = 384;
    float learning_rate = 3e-3F;
    std::uint64_t seed = 1234;
    std::size_t sample_length = 400;
    float temperature = 0.8F;
    std::filesystem::path corpus_dir = RIFTCO_TRANSFORMER_DEFAULT_CORPUS_DIR;
};

Options parse_options(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::cout << "usage: riftco-char-mlp [--steps N] [--batch B] [--context K] "
                         "[--embedding E] [--hidden H] [--learning-rate LR] [--seed S] "
                         "[--sample-length L] [--temperature T] [--corpus-dir DIR]\n";
            std::exit(0);
        }
        if (i + 1 >= argc) {
            throw std::invalid_argument(flag + " needs a value");
        }
        const std::string value = argv[++i];
        if (flag == "--steps")
            options.steps = examples::parse_positive_integer(flag, value);
        else if (flag == "--batch")
            options.batch = examples::parse_positive_integer(flag, value);
        else if (flag == "--context")
            options.context = examples::parse_positive_integer(flag, value);
        else if (flag == "--embedding")
            options.embedding = examples::parse_positive_integer(flag, value);
        else if (flag == "--hidden")
            options.hidden = examples::parse_positive_integer(flag, value);
        else if (flag == "--learning-rate")
            options.learning_rate =
                static_cast<float>(examples::parse_positive_number(flag, value));
        else if (flag == "--seed")
            options.seed = examples::parse_unsigned(flag, value);
        else if (flag == "--sample-length")
            options.sample_length = examples::parse_positive_integer(flag, value);
        else if (flag == "--temperature")
            options.temperature = static_cast<float>(examples::parse_positive_number(flag, value));
        else if (flag == "--corpus-dir")
            options.corpus_dir = value;
        else
            throw std::invalid_argument("unknown flag " + flag + " (see --help)");
    }
    return options;
}

// Portable random numbers: std::mt19937_64's bit stream is fully specified, and the float
// conversion is ours (24 random mantissa bits), so a seed means the same run everywhere.
class Random {
  public:
    explicit Random(std::uint64_t seed) : engine_(seed) {}
    float uniform() { return static_cast<float>(engine_() >> 40U) * 0x1.0p-24F; }  // [0, 1)
    float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
    std::size_t index(std::size_t count) { return static_cast<std::size_t>(engine_() % count); }

  private:
    std::mt19937_64 engine_;
};

Tensor uniform_tensor(Shape shape, float limit, Random& random) {
    std::vector<float> values(riftco_transformer::checked_element_count(shape));
    for (float& value : values)
        value = random.uniform(-limit, limit);
    return Tensor(std::move(shape), values);
}

struct Parameter {
    std::string name;
    Tensor value;
    Tensor first_moment;
    Tensor second_moment;
};

// The model's parameters, in a fixed order.
struct Model {
    std::size_t context;
    std::size_t embedding;
    std::vector<Parameter> parameters;  // E, ln_scale, ln_bias, W1, b1, W2, b2
    Tensor& operator[](std::size_t i) { return parameters[i].value; }
};

enum : std::size_t { embeddings, ln_scale, ln_bias, w1, b1, w2, b2 };

Model make_model(const Options& options, Random& random) {
    const std::size_t width = options.context * options.embedding;
    const auto xavier = [](std::size_t fan_in, std::size_t fan_out) {
        return static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
    };
    Model model{options.context, options.embedding, {}};
    const auto add = [&](std::string name, Tensor value) {
        Tensor zeros = Tensor::zeros(value.shape());
        model.parameters.push_back({std::move(name), std::move(value), zeros, zeros});
    };
    add("embeddings",
        uniform_tensor({vocabulary, options.embedding},
                       1.0F / std::sqrt(static_cast<float>(options.embedding)), random));
    add("ln.scale", Tensor::full({width}, 1.0F));
    add("ln.bias", Tensor::zeros({width}));
    add("hidden.weight",
        uniform_tensor({width, options.hidden}, xavier(width, options.hidden), random));
    add("hidden.bias", Tensor::zeros({options.hidden}));
    add("output.weight",
        uniform_tensor({options.hidden, vocabulary}, xavier(options.hidden, vocabulary), random));
    add("output.bias", Tensor::zeros({vocabulary}));
    return model;
}

// Activations the backward pass needs.
struct Forward {
    Tensor normalized;  // [B, K·E]
    Tensor mean;        // [B]
    Tensor inverse_deviation;
    Tensor inputs;          // [B, K·E] (pre-norm)
    Tensor pre_activation;  // [B, H]
    Tensor activation;      // [B, H]
    Tensor logits;          // [B, V]
};

Forward forward(Model& model, const std::vector<std::size_t>& context_ids, std::size_t rows) {
    Forward f;
    const std::size_t width = model.context * model.embedding;
    // ids [B·K] -> [B, K, E] -> [B, K·E]
    f.inputs = ops::gather_rows(model[embeddings], context_ids, {rows, model.context})
                   .reshape({rows, width});
    auto norm = ops::layer_norm(f.inputs, model[ln_scale], model[ln_bias]);  // [B, K·E]
    f.normalized = std::move(norm.output);
    f.mean = std::move(norm.mean);
    f.inverse_deviation = std::move(norm.inverse_deviation);
    // [B, K·E] x [K·E, H] + b1 -> [B, H]
    f.pre_activation = ops::add(ops::matmul(f.normalized, model[w1]),
                                ops::broadcast_to(model[b1], {rows, model[w1].shape()[1]}));
    f.activation = ops::gelu(f.pre_activation);
    // [B, H] x [H, V] + b2 -> [B, V]
    f.logits = ops::add(ops::matmul(f.activation, model[w2]),
                        ops::broadcast_to(model[b2], {rows, vocabulary}));
    return f;
}

// Returns the gradients of every parameter, in parameter order, from the loss's base
// gradient d_logits [B, V] (already divided by B).
std::vector<Tensor> backward(Model& model, const Forward& f, const Tensor& d_logits,
                             const std::vector<std::size_t>& context_ids) {
    const std::size_t rows = d_logits.shape()[0];
    std::vector<Tensor> g(model.parameters.size());
    g[w2] = ops::matmul(f.activation, d_logits, true, false);                   // [H, V] = Aᵀ·G
    g[b2] = ops::sum(d_logits, 0);                                              // [V]
    const Tensor d_activation = ops::matmul(d_logits, model[w2], false, true);  // [B, H] = G·W2ᵀ
    const Tensor d_pre = ops::gelu_backward(f.pre_activation, d_activation);    // [B, H]
    g[w1] = ops::matmul(f.normalized, d_pre, true, false);                      // [K·E, H]
    g[b1] = ops::sum(d_pre, 0);                                                 // [H]
    const Tensor d_normalized = ops::matmul(d_pre, model[w1], false, true);     // [B, K·E]
    auto d_norm = ops::layer_norm_backward(f.inputs, model[ln_scale], f.mean, f.inverse_deviation,
                                           d_normalized);
    g[ln_scale] = std::move(d_norm.scale);
    g[ln_bias] = std::move(d_norm.bias);
    // [B, K·E] -> [B·K, E] rows scattered back onto their byte ids
    g[embeddings] = ops::scatter_add_rows(
        d_norm.input.reshape({rows * model.context, model.embedding}), context_ids, vocabulary);
    return g;
}

// Adam (β1 0.9, β2 0.999, ε 1e-8) written with raw tensor ops.
void adam_step(Model& model, const std::vector<Tensor>& gradients, float learning_rate,
               std::size_t step) {
    constexpr float beta1 = 0.9F;
    constexpr float beta2 = 0.999F;
    const auto correction1 =
        static_cast<float>(1.0 / (1.0 - std::pow(0.9, static_cast<double>(step))));
    const auto correction2 =
        static_cast<float>(1.0 / (1.0 - std::pow(0.999, static_cast<double>(step))));
    for (std::size_t i = 0; i < model.parameters.size(); ++i) {
        Parameter& p = model.parameters[i];
        const Tensor& g = gradients[i];
        p.first_moment = ops::add(ops::scale(p.first_moment, beta1), ops::scale(g, 1.0F - beta1));
        p.second_moment = ops::add(ops::scale(p.second_moment, beta2),
                                   ops::scale(ops::multiply(g, g), 1.0F - beta2));
        const Tensor denominator =
            ops::add_scalar(ops::sqrt(ops::scale(p.second_moment, correction2)), 1e-8F);
        const Tensor update =
            ops::divide(ops::scale(p.first_moment, correction1 * learning_rate), denominator);
        p.value = ops::subtract(p.value, update);
    }
}

void fill_batch(const std::string& text, std::size_t begin, std::size_t end, std::size_t context,
                std::size_t rows, Random& random, std::vector<std::size_t>& context_ids,
                std::vector<std::uint32_t>& targets) {
    context_ids.resize(rows * context);
    targets.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t t = begin + context + random.index(end - begin - context);
        for (std::size_t c = 0; c < context; ++c) {
            context_ids[r * context + c] = static_cast<unsigned char>(text[t - context + c]);
        }
        targets[r] = static_cast<unsigned char>(text[t]);
    }
}

// Mean cross-entropy (nats/byte) over every position of text[begin+K, end).
double evaluate(Model& model, const std::string& text, std::size_t begin, std::size_t end) {
    constexpr std::size_t eval_rows = 2048;
    double total = 0.0;
    std::size_t count = 0;
    std::vector<std::size_t> context_ids;
    std::vector<std::uint32_t> targets;
    for (std::size_t t0 = begin + model.context; t0 < end; t0 += eval_rows) {
        const std::size_t rows = std::min(eval_rows, end - t0);
        context_ids.resize(rows * model.context);
        targets.resize(rows);
        for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t c = 0; c < model.context; ++c) {
                context_ids[r * model.context + c] =
                    static_cast<unsigned char>(text[t0 + r - model.context + c]);
            }
            targets[r] = static_cast<unsigned char>(text[t0 + r]);
        }
        const Forward f = forward(model, context_ids, rows);
        total += static_cast<double>(ops::cross_entropy(f.logits, targets).loss.item()) *
                 static_cast<double>(rows);
        count += rows;
    }
    return total / static_cast<double>(count);
}

// Held-out cross-entropy of the training bytes' add-one-smoothed unigram distribution.
double unigram_baseline(const std::string& text, std::size_t split, std::size_t end) {
    std::vector<double> counts(vocabulary, 1.0);
    for (std::size_t i = 0; i < split; ++i)
        counts[static_cast<unsigned char>(text[i])] += 1.0;
    const double total = static_cast<double>(split) + static_cast<double>(vocabulary);
    double loss = 0.0;
    for (std::size_t i = split; i < end; ++i) {
        loss -= std::log(counts[static_cast<unsigned char>(text[i])] / total);
    }
    return loss / static_cast<double>(end - split);
}

std::string sample(Model& model, const std::string& prompt, std::size_t length, float temperature,
                   Random& random) {
    std::string text = prompt;
    std::vector<std::size_t> context_ids(model.context);
    for (std::size_t n = 0; n < length; ++n) {
        for (std::size_t c = 0; c < model.context; ++c) {
            context_ids[c] = static_cast<unsigned char>(text[text.size() - model.context + c]);
        }
        const Forward f = forward(model, context_ids, 1);
        const std::vector<float> p =
            ops::softmax(ops::scale(f.logits, 1.0F / temperature), 1).to_host();
        float u = random.uniform();
        std::size_t next = 0;
        while (next + 1 < vocabulary && u >= p[next])
            u -= p[next++];
        text.push_back(static_cast<char>(next));
    }
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options options = parse_options(argc, argv);
        const std::string text = examples::read_corpus(options.corpus_dir);
        const std::size_t split = text.size() * 9 / 10;  // last 10% held out
        Random random(options.seed);
        Model model = make_model(options, random);
        std::size_t parameter_count = 0;
        for (const auto& p : model.parameters)
            parameter_count += p.value.numel();
        std::cout << "corpus: " << text.size() << " bytes from " << options.corpus_dir.string()
                  << " (train " << split << ", held out " << text.size() - split << ")\n"
                  << "model: context " << options.context << " bytes, embedding "
                  << options.embedding << ", hidden " << options.hidden << ", " << parameter_count
                  << " parameters; batch " << options.batch << ", "
                  << riftco_transformer::cpu_thread_count() << " CPU threads\n";

        std::vector<std::size_t> context_ids;
        std::vector<std::uint32_t> targets;
        const auto start = std::chrono::steady_clock::now();
        double smoothed_loss = 0.0;
        for (std::size_t step = 1; step <= options.steps; ++step) {
            fill_batch(text, 0, split, options.context, options.batch, random, context_ids,
                       targets);
            const Forward f = forward(model, context_ids, options.batch);
            const auto loss = ops::cross_entropy(f.logits, targets);
            adam_step(model, backward(model, f, loss.gradient, context_ids), options.learning_rate,
                      step);
            const double value = loss.loss.item();
            smoothed_loss = step == 1 ? value : 0.95 * smoothed_loss + 0.05 * value;
            if (step % 100 == 0 || step == options.steps) {
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                const double rate = static_cast<double>(step * options.batch) / seconds;
                const double eta =
                    seconds / static_cast<double>(step) * static_cast<double>(options.steps - step);
                std::cout << "step " << std::setw(5) << step << "  loss " << std::fixed
                          << std::setprecision(4) << smoothed_loss << "  " << std::setprecision(0)
                          << rate << " tokens/s  eta " << std::setprecision(1) << eta << " s\n";
            }
        }
        const double held_out = evaluate(model, text, split, text.size());
        const double baseline = unigram_baseline(text, split, text.size());
        std::cout << std::setprecision(4) << "held-out loss " << held_out << " nats/byte ("
                  << held_out / std::log(2.0) << " bits/byte); unigram baseline " << baseline
                  << " nats/byte\n\n";
        std::cout << sample(model, "Alice ", options.sample_length, options.temperature, random)
                  << "\n";
        return held_out < baseline ? 0 : 1;
    } catch (const std::exception& error) {
        std::cerr << "riftco-char-mlp: " << error.what() << '\n';
        return 2;
    }
}
