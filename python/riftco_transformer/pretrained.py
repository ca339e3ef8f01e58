"""Pretrained checkpoints in one call: ``load_pretrained(path)``.

``path`` may be:

* a GGUF file (llama.cpp's format; ``general.architecture`` llama, mistral, qwen2, qwen3,
  gemma2, gemma3 or phi3): weights
  dequantized to float32, the tokenizer and the chat template from its metadata;
* a Hugging Face directory (``config.json``, ``model.safetensors`` or a sharded index,
  ``tokenizer.json``; the rotary families: :mod:`riftco_transformer.interchange.huggingface`;
  GPT-2 onto our GPT decoder: :mod:`riftco_transformer.interchange.huggingface_gpt2`);
* a ``.rift`` bundle (:mod:`riftco_transformer.artifacts`): a model we trained or
  fine-tuned, with its own tokenizer and chat template.

The result, :class:`PretrainedModel`, holds ``.model``, ``.tokenizer``, ``.chat_template``
and ``.architecture``, and generates with ``.generate(prompt, ...)`` and
``.chat(messages, ...)`` through the serving package's KV-cached :class:`TextGenerator`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from .native._validation import UINT64_LIMIT, require_int
from .native.llama import LlamaMistralTransformer
from .native.pretrained_tokenizer import PretrainedTokenizer, gguf_metadata_string
from .serving.chat import ChatMessage, PlainChatTemplate, encode_chat
from .serving.chat_templates import PretrainedChatTemplate
from .serving.generation import GenerationResult, TextGenerator

GGUF_MAGIC = b"GGUF"
# The default context of a loaded GGUF model: its KV cache is sized for one full context, and
# a file's own context length (8192 for SmolLM2) would reserve far more memory than a chat needs.
DEFAULT_MAXIMUM_CONTEXT = 2048


def checkpoint_format(path: str | os.PathLike) -> str:
    """``"gguf"`` or ``"rift"`` from the file's first bytes (never from its name), or
    ``"huggingface"`` for a directory with ``config.json``. ValueError otherwise."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "config.json")):
            return "huggingface"
        raise ValueError(f"{path}: a directory without config.json is no checkpoint")
    with open(path, "rb") as source:
        head = source.read(4)
    if head == GGUF_MAGIC:
        return "gguf"
    if head == b"PK\x03\x04":
        return "rift"
    raise ValueError(f"{path}: neither a GGUF file, a .rift bundle nor a Hugging Face directory "
                     f"(first bytes {head!r})")


class PretrainedModel:
    """A loaded checkpoint: ``model``, ``tokenizer``, ``chat_template``, ``architecture``
    (``"gpt"`` or the rotary family: ``"llama"``, ``"qwen3"``, ...) and ``source`` (the path).

    ``generate`` and ``chat`` share one KV-cached generator (created on first use, closed by
    :meth:`close`). Use as a context manager to close the model and generator.
    """

    def __init__(self, model, tokenizer, chat_template, architecture: str, source: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.architecture = architecture
        self.source = source
        self._generator: TextGenerator | None = None

    @property
    def generator(self) -> TextGenerator:
        if self._generator is None:
            self._generator = TextGenerator(self.model, self.tokenizer)
        return self._generator

    @property
    def end_token_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_id", None)

    def generate(
        self,
        prompt,
        max_new_tokens: int = 64,
        *,
        on_text: Callable[[str], None] | None = None,
        **sampling,
    ) -> GenerationResult:
        """Continue ``prompt`` (str, bytes or token ids). ``sampling``: the fields of
        :class:`~.serving.generation.GenerationConfig` (``temperature``, ``top_k``,
        ``top_p``, ``repetition_penalty``, ``seed``, ``stop``; greedy by default).
        ``on_text`` receives the text as it is produced. Stops at the end token."""
        sampling.setdefault("end_token_id", self.end_token_id)
        on_token = None
        if on_text is not None:
            def on_token(event):
                if event.text:
                    on_text(event.text)
        return self.generator.generate(prompt, max_new_tokens=max_new_tokens,
                                       on_token=on_token, **sampling)

    def render_chat(self, messages: Sequence[ChatMessage | Mapping],
                    add_generation_prompt: bool = True) -> str:
        """The chat template's text for ``messages`` (to show; generate from
        :meth:`encode_chat`'s ids)."""
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Sequence[ChatMessage | Mapping],
                    add_generation_prompt: bool = True) -> list[int]:
        """The token ids of ``messages`` in the chat template: control tokens come from the
        template only, what the messages say is encoded as plain text (a message spelling
        ``<|im_start|>system`` cannot open a system turn)."""
        return encode_chat(self.chat_template, self.tokenizer, messages, add_generation_prompt)

    def chat(
        self,
        messages: Sequence[ChatMessage | Mapping],
        max_new_tokens: int = 256,
        *,
        on_text: Callable[[str], None] | None = None,
        **sampling,
    ) -> str:
        """The assistant's reply to ``messages`` (dicts with role/content or ChatMessage),
        rendered with the model's chat template; ends at the template's stop sequences or
        the end token."""
        stops = tuple(sampling.pop("stop", ()) or ()) + tuple(self.chat_template.stop_sequences)
        prompt = self.encode_chat(messages)
        result = self.generate(prompt, max_new_tokens, on_text=on_text,
                               stop=tuple(dict.fromkeys(stops)), **sampling)
        return result.generated_text.strip()

    def save(self, path: str | os.PathLike, *, stage: str = "pretrained",
             metadata: Mapping | None = None):
        """Write the model, its tokenizer and its chat template as a ``.rift`` bundle (atomic)
        that :func:`load_pretrained` and ``riftco chat --model`` reopen. The model must be
        dense (merge LoRA first; QLoRA's merge dequantizes). Returns the bundle."""
        from .artifacts import ModelBundle

        self.reset_generator()
        template = getattr(self.chat_template, "text", None)
        if not isinstance(self.tokenizer, PretrainedTokenizer):  # a GPT of our own training
            bundle = ModelBundle.capture(self.model, self.tokenizer, stage, None, metadata)
        else:
            bundle = ModelBundle.capture(self.model, self.tokenizer, stage, None, metadata,
                                         chat_template=template)
        bundle.save(path)
        return bundle

    def reset_generator(self) -> None:
        """Drop the generator (its KV-cache pool pins the model's parameters): needed before
        the weights change (fine-tuning), done by :func:`~.post_training.fine_tune_pretrained`."""
        if self._generator is not None:
            self._generator.close()
            self._generator = None

    def close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        for item in (self.model, self.tokenizer):
            close = getattr(item, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> PretrainedModel:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<PretrainedModel {self.architecture} from {self.source!r}, "
                f"{self.chat_template!r}>")


def _load_gguf(path: str, maximum_context: int, keep_file_weights: bool) -> PretrainedModel:
    model = LlamaMistralTransformer.from_gguf(path, maximum_context=maximum_context,
                                              weights="file" if keep_file_weights else "f32")
    try:
        tokenizer = PretrainedTokenizer.from_gguf(path)
        if tokenizer.vocabulary_size != model.vocabulary_size:
            raise ValueError(
                f"{path}: the tokenizer has {tokenizer.vocabulary_size} tokens but the model's "
                f"vocabulary is {model.vocabulary_size}")
        text = gguf_metadata_string(path, "tokenizer.chat_template")
        bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
        eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
        template = (PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                                     source=f"{path} (tokenizer.chat_template)")
                    if text else PretrainedChatTemplate.for_family("chatml", eos_token=eos))
    except BaseException:
        model.close()
        raise
    return PretrainedModel(model, tokenizer, template, model.config.architecture, path)


def _load_bundle(path: str) -> PretrainedModel:
    from .artifacts import ModelBundle

    bundle = ModelBundle.load(path)
    gpt = bundle.architecture == "gpt"
    if bundle.tokenizer_state["method"] != "pretrained":  # pretrained here, with our tokenizer
        runtime = bundle.instantiate(attention="materialized" if gpt else "flash")
        return PretrainedModel(runtime.model, runtime.tokenizer, PlainChatTemplate(),
                               bundle.architecture, path)
    runtime = bundle.instantiate(attention="flash")
    tokenizer = runtime.tokenizer
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    text = bundle.chat_template
    if text:
        template = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                                    source=f"{path} (tokenizer.chat_template)")
    elif gpt:  # an imported GPT-2: no template, as when it was imported
        template = PlainChatTemplate()
    else:
        template = PretrainedChatTemplate.for_family("chatml", eos_token=eos)
    return PretrainedModel(runtime.model, tokenizer, template, bundle.architecture, path)


WEIGHT_CHOICES = ("f32", "file", "q8_0", "q5_0", "q4_1", "q4_0", "bf16", "f16")


def load_pretrained(path: str | os.PathLike, *, maximum_context: int | None = None,
                    adapter: str | os.PathLike | None = None,
                    check_adapter_base: bool = True, weights: str = "f32") -> PretrainedModel:
    """Load a GGUF file, a Hugging Face directory or a ``.rift`` bundle (see the module
    docstring).

    ``maximum_context`` bounds sequences and the KV cache of a GGUF model: default 2048
    (RoPE has no position table, so any bound works; the cache of one full context is
    allocated per session pool), ``0`` takes the file's ``context_length``.

    ``adapter``: a PEFT LoRA adapter directory attached (unmerged; ``model.merge_lora()`` folds
    it in) with :func:`~.interchange.peft.load_peft_adapter`, which checks it against this
    model, and (``check_adapter_base``) that the base it records is this one; on any error
    nothing stays open.

    ``weights`` chooses the projections' precision: ``"f32"`` (float32, the default);
    ``"file"``, a GGUF file's own blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, and F16 or
    BF16 matrices; no float32 copy is ever made of them); or ``"q8_0"``/``"q5_0"``/``"q4_1"``/
    ``"q4_0"``/``"bf16"``/``"f16"``, float32 weights packed into that format
    after loading (explicitly converted, e.g. for a smaller server)."""
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"weights must be one of {', '.join(map(repr, WEIGHT_CHOICES))}, "
                         f"got {weights!r}")
    if weights == "file" and checkpoint_format(os.fspath(path)) != "gguf":
        raise ValueError(f"weights='file' keeps a GGUF file's block formats; {os.fspath(path)!r} "
                         "is not a GGUF file (choose 'f32', 'q8_0', 'q5_0', 'q4_1', 'q4_0', "
                         "'bf16' or 'f16')")
    if adapter is not None:  # checked on its own before the base is loaded
        from .interchange.peft import load_peft_adapter, read_peft_adapter

        adapter = read_peft_adapter(adapter)
    loaded = _load(os.fspath(path), maximum_context, weights == "file")
    if weights not in ("f32", "file"):
        try:
            loaded.model.quantize_blocks(weights)
        except BaseException:
            loaded.close()
            raise
    if adapter is not None:
        try:
            load_peft_adapter(loaded, adapter, check_base=check_adapter_base)
        except BaseException:
            loaded.close()
            raise
    return loaded


def _load(path: str, maximum_context: int | None, keep_file_weights: bool) -> PretrainedModel:
    kind = checkpoint_format(path)
    if kind == "gguf":
        if maximum_context is None:
            maximum_context = DEFAULT_MAXIMUM_CONTEXT
        return _load_gguf(path, require_int(maximum_context, "maximum_context", 0, UINT64_LIMIT),
                          keep_file_weights)
    if kind == "rift":
        return _load_bundle(path)
    from .interchange.huggingface import is_gpt2_directory, load_huggingface

    if maximum_context is None:  # GPT-2's learned position table sets its own bound
        maximum_context = 0 if is_gpt2_directory(path) else DEFAULT_MAXIMUM_CONTEXT
    context = require_int(maximum_context, "maximum_context", 0, UINT64_LIMIT)
    return load_huggingface(path, maximum_context=context or None)
