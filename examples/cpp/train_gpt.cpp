// riftco-train: pretrain a small GPT on the bundled corpus and sample from it.
//
// Fits a tokenizer (BPE by default) on the training part of the corpus, trains the decoder
// with Adam (warmup + cosine schedule, global-norm clipping), prints step, loss, tokens/s and
// an ETA, reports held-out loss against the unigram baseline of the same tokenizer, and ends
// by sampling text through a KV-cached decode session. Exit status 0 only when the held-out loss
// beats the baseline (by at least
// --require-improvement nats).
//
// `riftco-train --help` lists every flag with its default and meaning (the table in flags()).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "example_support.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "riftco_transformer/data/batching.hpp"
#include "riftco_transformer/data/tokenizer_factory.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "riftco_transformer/serving/decode_session.hpp"

namespace {

using namespace riftco_transformer;

struct Options {
    std::size_t steps = 300;
    std::size_t batch = 16;
    std::size_t context = 64;
    std::size_t width = 128;
    std::size_t heads = 4;
    std::size_t blocks = 2;
    std::size_t feed_forward = 512;
    TokenizerMethod tokenizer = TokenizerMethod::Bpe;
    std::size_t vocabulary = 512;
    double learning_rate = 3e-3;
    std::size_t warmup = 30;
    AttentionKind attention = AttentionKind::Flash;
    ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled;
    std::uint64_t seed = 1234;
    std::size_t sample_length = 200;
    float temperature = 0.8F;
    double required_improvement = 0.0;
    std::filesystem::path corpus_dir = RIFTCO_TRANSFORMER_DEFAULT_CORPUS_DIR;
    bool data_parallel = false;
    bool overlap = true;
    bool zero = false;
    double collective_timeout = 120.0;
    ExecutionBackend backend = ExecutionBackend::Cpu;
};

template <typename Value>
std::string text_of(const Value& value) {
    std::ostringstream text;
    text << value;
    return text.str();
}

// One command-line flag: the placeholder of its value, its meaning, how its default prints,
// and how its value is parsed into Options. --help and parsing both read this one table.
struct Flag {
    const char* name;
    const char* placeholder;
    const char* meaning;
    std::function<std::string(const Options&)> shown_default;
    std::function<void(Options&, const std::string& flag, const std::string& value)> set;
};

// A flag holding a positive integer in `member`.
Flag positive_integer_flag(const char* name, const char* placeholder, const char* meaning,
                           std::size_t Options::*member) {
    return {name, placeholder, meaning, [member](const Options& o) { return text_of(o.*member); },
            [member](Options& o, const std::string& f, const std::string& v) {
                o.*member = examples::parse_positive_integer(f, v);
            }};
}

const std::vector<Flag>& flags() {
    using examples::parse_positive_integer;
    using examples::parse_positive_number;
    static const std::vector<Flag> table = {
        positive_integer_flag("--steps", "N", "training steps (Adam updates)", &Options::steps),
        positive_integer_flag("--batch", "B",
                              "sequences per training batch (also rows per evaluation pass)",
                              &Options::batch),
        positive_integer_flag("--context", "T", "tokens per sequence, the model's maximum context",
                              &Options::context),
        positive_integer_flag("--width", "D", "model width", &Options::width),
        positive_integer_flag("--heads", "H", "attention heads (must divide --width)",
                              &Options::heads),
        positive_integer_flag("--blocks", "N", "transformer blocks", &Options::blocks),
        positive_integer_flag("--feed-forward", "F", "feed-forward hidden width",
                              &Options::feed_forward),
        {"--tokenizer", "bpe|byte", "tokenizer fitted on the training text",
         [](const Options& o) { return std::string(tokenizer_method_name(o.tokenizer)); },
         [](Options& o, const std::string&, const std::string& v) {
             o.tokenizer = parse_tokenizer_method(v);
         }},
        positive_integer_flag("--vocabulary", "V",
                              "BPE vocabulary size (the byte tokenizer ignores it)",
                              &Options::vocabulary),
        {"--learning-rate", "LR", "peak Adam learning rate (cosine decay to 0.1 x LR)",
         [](const Options& o) { return text_of(o.learning_rate); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.learning_rate = parse_positive_number(f, v);
         }},
        {"--warmup", "S", "linear warmup steps, 0 allowed (if >= --steps: --steps / 10)",
         [](const Options& o) { return text_of(o.warmup); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.warmup = v == "0" ? 0 : parse_positive_integer(f, v);
         }},
        {"--attention", "materialized|flash",
         "full-sequence attention: keep the [B,H,T,T] probabilities, or memory-linear flash",
         [](const Options& o) {
             return std::string(o.attention == AttentionKind::Flash ? "flash" : "materialized");
         },
         [](Options& o, const std::string&, const std::string& v) {
             if (v == "materialized")
                 o.attention = AttentionKind::Materialized;
             else if (v == "flash")
                 o.attention = AttentionKind::Flash;
             else
                 throw std::invalid_argument("--attention must be materialized or flash (got '" +
                                             v + "')");
         }},
        {"--backend", "cpu|metal|cuda|tpu|pjrt",
         "where the model lives and trains (tpu/pjrt: the PJRT adapter; pjrt loads the plugin "
         "$RIFTCO_TRANSFORMER_PJRT_PLUGIN names); an unavailable backend is an error",
         [](const Options& o) { return std::string(execution_backend_name(o.backend)); },
         [](Options& o, const std::string&, const std::string& v) {
             for (const ExecutionBackend backend :
                  {ExecutionBackend::Cpu, ExecutionBackend::Metal, ExecutionBackend::Cuda,
                   ExecutionBackend::Tpu, ExecutionBackend::Pjrt}) {
                 if (v == execution_backend_name(backend)) {
                     o.backend = backend;
                     return;
                 }
             }
             throw std::invalid_argument("--backend must be cpu, metal, cuda, tpu or pjrt (got '" +
                                         v + "')");
         }},
        {"--activation-checkpointing", "disabled|block",
         "block: recompute each block during backward instead of keeping its activations",
         [](const Options& o) {
             return std::string(o.checkpointing == ActivationCheckpointing::Disabled ? "disabled"
                                                                                     : "block");
         },
         [](Options& o, const std::string&, const std::string& v) {
             if (v == "disabled")
                 o.checkpointing = ActivationCheckpointing::Disabled;
             else if (v == "block")
                 o.checkpointing = ActivationCheckpointing::TransformerBlock;
             else
                 throw std::invalid_argument(
                     "--activation-checkpointing must be disabled or block (got '" + v + "')");
         }},
        {"--seed", "S", "seed of the initial weights, the batch order and the sampling",
         [](const Options& o) { return text_of(o.seed); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.seed = examples::parse_unsigned(f, v);
         }},
        positive_integer_flag("--sample-length", "L",
                              "tokens generated after training (prompt: \"Alice \")",
                              &Options::sample_length),
        {"--temperature", "T", "sampling temperature",
         [](const Options& o) { return text_of(o.temperature); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.temperature = static_cast<float>(parse_positive_number(f, v));
         }},
        {"--corpus-dir", "DIR",
         "directory whose *.txt files, in name order, are the corpus (last 10% held out)",
         [](const Options& o) { return o.corpus_dir.string(); },
         [](Options& o, const std::string&, const std::string& v) { o.corpus_dir = v; }},
        {"--require-improvement", "NATS",
         "exit 1 unless the held-out loss is more than NATS nats/token below the unigram "
         "baseline",
         [](const Options& o) { return text_of(o.required_improvement); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.required_improvement = parse_positive_number(f, v, true);
         }},
        // A switch (no value): the placeholder is empty.
        {"--data-parallel", "",
         "run as one rank of `mpirun -n R riftco-train ...`: each rank trains on its shard of "
         "every batch of --batch rows (a multiple of R) and gradients are averaged, so the run "
         "equals one process on the same batches; rank 0 prints, evaluates and samples (needs "
         "a build with RIFTCO_TRANSFORMER_ENABLE_MPI=ON)",
         [](const Options& o) { return std::string(o.data_parallel ? "on" : "off"); },
         [](Options& o, const std::string&, const std::string&) { o.data_parallel = true; }},
        {"--reduction", "overlapped|blocking",
         "with --data-parallel: average the gradients while backward runs (buckets start as "
         "their gradients are final), or after it; the results are bit-identical",
         [](const Options& o) { return std::string(o.overlap ? "overlapped" : "blocking"); },
         [](Options& o, const std::string&, const std::string& v) {
             if (v == "overlapped")
                 o.overlap = true;
             else if (v == "blocking")
                 o.overlap = false;
             else
                 throw std::invalid_argument("--reduction must be overlapped or blocking (got '" +
                                             v + "')");
         }},
        {"--zero-1", "",
         "with --data-parallel: shard Adam's moments over the ranks (ZeRO-1): each rank updates "
         "its share of the parameters and the values are gathered after every step",
         [](const Options& o) { return std::string(o.zero ? "on" : "off"); },
         [](Options& o, const std::string&, const std::string&) { o.zero = true; }},
        {"--collective-timeout", "SECONDS",
         "with --data-parallel: how long a collective waits for the other ranks before every "
         "rank stops with an error",
         [](const Options& o) { return text_of(o.collective_timeout); },
         [](Options& o, const std::string& f, const std::string& v) {
             o.collective_timeout = parse_positive_number(f, v);
         }},
    };
    return table;
}

void print_help(std::ostream& out) {
    out << "usage: riftco-train [FLAG VALUE]...\n\n"
           "Fits a tokenizer on the training part of the corpus, pretrains a small GPT with Adam\n"
           "(warmup + cosine schedule, global-norm clipping), reports held-out loss against the\n"
           "unigram baseline of the same tokenizer, and samples text. Exit status: 0 when the\n"
           "held-out loss beats the baseline by more than --require-improvement, 1 when it does\n"
           "not, 2 for a bad flag or any other error.\n\n"
           "flags:\n";
    const Options defaults;
    for (const Flag& flag : flags()) {
        out << "  " << flag.name << (*flag.placeholder != '\0' ? " " : "") << flag.placeholder
            << "   (default: " << flag.shown_default(defaults) << ")\n      " << flag.meaning
            << '\n';
    }
    out << "  -h, --help\n      print this help and exit\n";
}

// The options, or nullopt when --help was asked for. An unknown flag or a flag without a
// value: std::invalid_argument naming it.
std::optional<Options> parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string name = argv[i];
        if (name == "--help" || name == "-h")
            return std::nullopt;
        const auto flag = std::find_if(flags().begin(), flags().end(), [&](const Flag& candidate) {
            return name == candidate.name;
        });
        if (flag == flags().end())
            throw std::invalid_argument("unknown flag '" + name + "' (see --help)");
        if (*flag->placeholder == '\0') {  // a switch
            flag->set(o, name, "");
            continue;
        }
        if (i + 1 >= argc)
            throw std::invalid_argument(name + " needs a value (" + flag->placeholder + ")");
        flag->set(o, name, argv[++i]);
    }
    if (o.zero && !o.data_parallel)
        throw std::invalid_argument("--zero-1 needs --data-parallel");
    if (o.warmup >= o.steps)
        o.warmup = o.steps / 10;
    return o;
}

// Mean loss over every position of held-out windows (non-overlapping, full context).
// Rows per forward pass = the training batch size, so evaluation never needs more memory than
// a training step.
double evaluate(const DecoderOnlyTransformer& model, const std::vector<std::uint32_t>& tokens,
                std::size_t context, std::size_t rows_per_batch) {
    const NoGradientGuard no_graph;  // evaluation keeps no activations for a backward pass
    double total = 0.0;
    std::size_t count = 0;
    std::vector<std::uint32_t> inputs;
    std::vector<std::uint32_t> targets;
    for (std::size_t start = 0; start + context + 1 <= tokens.size();) {
        inputs.clear();
        targets.clear();
        std::size_t rows = 0;
        for (; rows < rows_per_batch && start + context + 1 <= tokens.size();
             ++rows, start += context) {
            inputs.insert(inputs.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start),
                          tokens.begin() + static_cast<std::ptrdiff_t>(start + context));
            targets.insert(targets.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start + 1),
                           tokens.begin() + static_cast<std::ptrdiff_t>(start + context + 1));
        }
        const Variable logits = model.forward(inputs, {rows, context});
        total +=
            static_cast<double>(tensor_ops::cross_entropy(logits.value(), targets).loss.item()) *
            static_cast<double>(targets.size());
        count += targets.size();
    }
    return total / static_cast<double>(count);
}

// Cross-entropy of the add-one-smoothed training unigram distribution on held-out tokens.
double unigram_baseline(const std::vector<std::uint32_t>& train,
                        const std::vector<std::uint32_t>& held_out, std::size_t vocabulary) {
    std::vector<double> counts(vocabulary, 1.0);
    for (const std::uint32_t token : train)
        counts[token] += 1.0;
    const double total = static_cast<double>(train.size() + vocabulary);
    double loss = 0.0;
    for (const std::uint32_t token : held_out)
        loss -= std::log(counts[token] / total);
    return loss / static_cast<double>(held_out.size());
}

// KV-cached generation (docs/ARCHITECTURE.md, 'Context rollover'): prefill the newest C prompt
// tokens in one pass, then one decode step per new token; when the session is full, roll over by
// replaying the newest C tokens from position 0 (positions are learned and absolute, so old pages
// cannot just be dropped). The last sampled token is never fed.
std::vector<std::uint32_t> sample(const DecoderOnlyTransformer& model,
                                  std::vector<std::uint32_t> tokens, std::size_t length,
                                  float temperature, std::mt19937_64& generator) {
    const std::size_t context = model.dimensions().maximum_context;
    const std::size_t vocabulary = model.dimensions().vocabulary_size;
    const auto newest = [&] {
        const std::size_t window = std::min(context, tokens.size());
        return std::vector<std::uint32_t>(tokens.end() - static_cast<std::ptrdiff_t>(window),
                                          tokens.end());
    };
    DecodeSession session(model);
    Tensor logits = session.prefill(newest());
    for (std::size_t n = 0; n < length; ++n) {
        const std::vector<float> p =
            tensor_ops::softmax(tensor_ops::scale(logits.reshape({vocabulary}), 1.0F / temperature),
                                0)
                .to_host();
        double u = static_cast<double>(generator() >> 11U) * 0x1.0p-53;
        std::uint32_t next = 0;
        while (next + 1 < vocabulary && u >= p[next])
            u -= p[next++];
        tokens.push_back(next);
        if (n + 1 == length) {
            break;
        }
        if (session.size() == session.capacity()) {
            session.reset();
            logits = session.prefill(newest());
        } else {
            logits = session.decode_token(next);
        }
    }
    return tokens;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const std::optional<Options> parsed = parse(argc, argv);
        if (!parsed) {
            print_help(std::cout);
            return 0;
        }
        const Options& o = *parsed;
        // Everything below (model, batches, optimizer state, decoding) is made on this backend;
        // an unavailable one fails here, naming why.
        const ScopedExecutionBackend on_backend(o.backend);
        const std::string text = examples::read_corpus(o.corpus_dir);
        const std::size_t split = text.size() * 9 / 10;
        const std::string train_text = text.substr(0, split);
        const std::string held_out_text = text.substr(split);

        const auto fit_start = std::chrono::steady_clock::now();
        TokenizerOptions tokenizer_options;
        tokenizer_options.method = o.tokenizer;
        if (o.tokenizer == TokenizerMethod::Bpe)
            tokenizer_options.vocabulary_size = o.vocabulary;
        const auto tokenizer = create_tokenizer(text_bytes(train_text), tokenizer_options);
        // Held-out text is encoded with the training tokenizer; bytes it never saw cannot be
        // encoded by the byte method, so the split keeps whatever the tokenizer accepts.
        const std::vector<std::uint32_t> train = tokenizer->encode_bytes(text_bytes(train_text));
        const std::vector<std::uint32_t> held_out =
            tokenizer->encode_bytes(text_bytes(held_out_text));
        const double fit_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();

        const TransformerDimensions dims{.vocabulary_size = tokenizer->vocabulary_size(),
                                         .maximum_context = o.context,
                                         .model_width = o.width,
                                         .head_count = o.heads,
                                         .block_count = o.blocks,
                                         .feed_forward_width = o.feed_forward};
        // Data parallelism: every rank builds the same model, then takes rank 0's values; each
        // trains on its rows of every batch and the gradients are averaged before the step.
        std::unique_ptr<ProcessGroup> group;
        std::unique_ptr<DataParallel> parallel;
        if (o.data_parallel) {
            ProcessGroupOptions group_options;
            group_options.timeout = std::chrono::milliseconds(
                static_cast<std::int64_t>(std::ceil(o.collective_timeout * 1000.0)));
            group = create_process_group(group_options);
            parallel = std::make_unique<DataParallel>(*group);
        } else {
            group = create_single_process_group();
        }
        const bool leader = group->rank() == 0;
        // Only rank 0 prints: the other ranks' standard output goes nowhere.
        std::ostream out(leader ? std::cout.rdbuf() : nullptr);

        std::mt19937 init_generator(static_cast<std::mt19937::result_type>(o.seed));
        DecoderOnlyTransformer model(dims, init_generator, 1e-5F, o.attention, o.checkpointing);
        if (parallel)
            parallel->synchronize_parameters(model.parameters());
        AdamOptions adam_options;
        adam_options.learning_rate = o.learning_rate;
        adam_options.schedule = {LearningRateScheduleKind::WarmupCosine, o.warmup, o.steps, 0.1};
        std::optional<Adam> adam;
        std::optional<ZeroRedundancyAdam> zero;
        if (o.zero)
            zero.emplace(*parallel, model.parameters(), adam_options);
        else
            adam.emplace(model.parameters(), adam_options);
        WindowBatchSource batches(train, o.batch, o.context, o.seed + 1);
        const auto [row_begin, row_end] =
            parallel ? parallel->shard(o.batch) : std::pair<std::size_t, std::size_t>{0, o.batch};

        out << "cpu: " << cpu_info() << "\n";
        out << "corpus: " << text.size() << " bytes (" << train.size() << " training, "
            << held_out.size() << " held-out tokens); " << tokenizer_method_name(o.tokenizer)
            << " tokenizer, vocabulary " << dims.vocabulary_size << ", fitted in " << std::fixed
            << std::setprecision(2) << fit_seconds << " s\n"
            << "model: D=" << o.width << " H=" << o.heads << " N=" << o.blocks
            << " F=" << o.feed_forward << " T=" << o.context << ", " << model.parameter_count()
            << " parameters; batch " << o.batch << ", "
            << (o.attention == AttentionKind::Flash ? "flash" : "materialized")
            << " attention, backend " << execution_backend_name(o.backend) << ", "
            << cpu_thread_count() << " CPU threads";
        if (parallel) {
            out << " per rank; data parallel over " << group->world_size() << " ranks ("
                << (o.overlap ? "overlapped" : "blocking") << " reduction"
                << (zero ? ", ZeRO-1" : "") << ")";
        }
        out << "\n";

        const auto start = std::chrono::steady_clock::now();
        double smoothed = 0.0;
        for (std::size_t step = 1; step <= o.steps; ++step) {
            const TrainingBatch batch = batches.next();
            const auto first = static_cast<std::ptrdiff_t>(row_begin * o.context);
            const auto last = static_cast<std::ptrdiff_t>(row_end * o.context);
            const std::vector<std::uint32_t> inputs(batch.inputs.begin() + first,
                                                    batch.inputs.begin() + last);
            const std::vector<std::uint32_t> targets(batch.targets.begin() + first,
                                                     batch.targets.begin() + last);
            Variable loss =
                cross_entropy(model.forward(inputs, {row_end - row_begin, o.context}), targets);
            double value = loss.value().item();
            if (parallel) {
                // The global batch's mean loss and gradient (equal shards: plain averages).
                const auto weight = static_cast<double>(targets.size());
                double total = 0.0;
                if (o.overlap) {
                    total = parallel->backward_and_reduce(loss, model.parameters(), weight);
                } else {
                    loss.backward();
                    total = parallel->reduce_gradients(model.parameters(), weight);
                }
                value *= weight;
                group->allreduce_sum(std::span<double>(&value, 1));
                value /= total;
            } else {
                loss.backward();
            }
            const AdamStepStats stats = zero ? zero->step() : adam->step();
            smoothed = step == 1 ? value : 0.9 * smoothed + 0.1 * value;
            if (step % 25 == 0 || step == 1 || step == o.steps) {
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                const double rate = static_cast<double>(step * o.batch * o.context) / seconds;
                out << "step " << std::setw(5) << step << "  loss " << std::setprecision(4)
                    << smoothed << "  lr " << std::scientific << std::setprecision(2)
                    << stats.learning_rate << std::fixed << "  grad-norm " << std::setprecision(3)
                    << stats.gradient_norm << "  " << std::setprecision(0) << rate
                    << " tokens/s  eta " << std::setprecision(1)
                    << seconds / static_cast<double>(step) * static_cast<double>(o.steps - step)
                    << " s\n";
            }
        }
        if (parallel) {
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const std::vector<std::uint64_t> hashes =
                group->allgather(DataParallel::parameter_hash(model.parameters()));
            const bool identical =
                std::all_of(hashes.begin(), hashes.end(), [&](auto h) { return h == hashes[0]; });
            out << "data parallel: " << parallel->communicated_bytes() << " bytes through "
                << "collectives in " << std::setprecision(3) << parallel->communication_seconds()
                << " s (" << std::setprecision(1)
                << 100.0 * parallel->communication_seconds() / seconds
                << "% of training); replicas " << (identical ? "identical" : "DIFFER") << "\n";
            const std::size_t unsharded = 2 * model.parameter_count() * sizeof(float);
            const std::size_t held = zero ? zero->owned_state_bytes() : unsharded;
            out << "optimizer state per rank: " << held << " bytes (" << std::setprecision(3)
                << static_cast<double>(held) / static_cast<double>(unsharded)
                << " of the unsharded " << unsharded << ")\n";
            if (!identical)
                throw DistributedError("the replicas' parameters differ after training");
            if (!leader)
                return 0;  // rank 0 evaluates and samples
        }
        const CpuMemoryStatistics memory = cpu_memory_statistics();
        out << "peak tensor memory while training: " << std::setprecision(1)
            << static_cast<double>(memory.peak_live_bytes) / 1048576.0 << " MiB (block cache "
            << static_cast<double>(memory.cached_bytes) / 1048576.0 << " MiB)\n";
        const double held_out_loss = evaluate(model, held_out, o.context, o.batch);
        const double baseline = unigram_baseline(train, held_out, dims.vocabulary_size);
        out << std::setprecision(4) << "held-out loss " << held_out_loss
            << " nats/token; unigram baseline " << baseline << " nats/token\n\n";
        std::mt19937_64 sampler(o.seed + 2);
        const std::vector<std::uint32_t> prompt =
            tokenizer->encode_bytes(text_bytes(std::string("Alice ")));
        const std::vector<std::uint32_t> generated =
            sample(model, prompt, o.sample_length, o.temperature, sampler);
        const std::vector<std::uint8_t> bytes = tokenizer->decode_bytes(generated);
        out << std::string(bytes.begin(), bytes.end()) << "\n";
        return baseline - held_out_loss > o.required_improvement ? 0 : 1;
    } catch (const std::exception& error) {
        std::cerr << "riftco-train: " << error.what() << '\n';
        return 2;
    }
}
