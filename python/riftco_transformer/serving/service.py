"""A model behind a scheduler, with the limits a server applies: :class:`ModelService`."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..native._errors import RiftcoTransformerError
from ..native._validation import UINT32_LIMIT, describe_value, require_choice, require_int
from ._text import TokenBytes, lenient_utf8
from .chat import ChatMessage, ChatTemplate, PlainChatTemplate, chat_prompt
from .engine import KV_CACHE_KINDS, is_engine, make_engine
from .generation import (
    GenerationConfig,
    GenerationResult,
    encode_prompt,
    tokenizer_vocabulary_size,
)
from .scheduler import RequestHandle, Scheduler

MEBIBYTE = 1 << 20


def is_loopback_host(host: str) -> bool:
    """Whether a bind address or Host name only reaches this machine (``localhost``,
    127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServingConfig:
    """How a model is served.

    ``maximum_new_tokens`` caps every request's ``max_new_tokens``; None (``riftco serve``'s
    default) caps it at what the model's context leaves after the prompt (the OpenAI routes'
    default ``max_tokens``), whereas a number lets a request generate past the context (the
    stream rolls over); ``maximum_request_bytes``
    caps an HTTP request body. ``kv_cache`` (``"paged"`` or ``"contiguous"``),
    ``kv_cache_block_size`` (tokens per page) and ``kv_cache_block_count`` (pages in the
    shared pool; None: ``max_active_requests`` full contexts, so every admitted request fits
    without waiting) configure a native engine; the full-forward fallback ignores them.
    ``host`` must be a loopback address unless ``allow_remote`` (ValueError otherwise);
    ``port`` 0 picks a free port. ``model_name`` is the id ``/v1/models`` lists.
    ``max_active_requests``, ``max_queued_requests`` and ``prefill_chunk_tokens`` configure
    the scheduler. ``request_timeout_seconds`` is the deadline for a client's whole request
    (request line, headers and body) from the moment the server takes the connection, and
    the bound on each write of the answer; ``max_connections`` caps the connections the HTTP
    server serves at once (each has a thread; one more is answered 503 and closed).
    ``api_key`` (None: none) is the key ``/v1/*`` and ``/metrics`` require as
    ``Authorization: Bearer <key>`` (``serving.http``); it is left out of the repr.
    """

    maximum_new_tokens: int | None = 256
    maximum_request_bytes: int = MEBIBYTE
    kv_cache: str = "paged"
    kv_cache_block_size: int = 16
    kv_cache_block_count: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    allow_remote: bool = False
    model_name: str = "riftco"
    max_active_requests: int = 8
    max_queued_requests: int = 64
    prefill_chunk_tokens: int = 64
    request_timeout_seconds: float = 30.0
    max_connections: int = 128
    api_key: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.maximum_new_tokens is not None:
            require_int(self.maximum_new_tokens, "maximum_new_tokens", 1, UINT32_LIMIT)
        require_int(self.maximum_request_bytes, "maximum_request_bytes", 1, 1 << 40)
        require_choice(self.kv_cache, "kv_cache", KV_CACHE_KINDS)
        require_int(self.kv_cache_block_size, "kv_cache_block_size", 1, UINT32_LIMIT)
        if self.kv_cache_block_count is not None:
            require_int(self.kv_cache_block_count, "kv_cache_block_count", 1, UINT32_LIMIT)
        if not isinstance(self.host, str) or not self.host:
            raise TypeError(f"host must be a nonempty str, got {describe_value(self.host)}")
        require_int(self.port, "port", 0, 65536)
        if not isinstance(self.allow_remote, bool):
            raise TypeError(f"allow_remote must be a bool, got {describe_value(self.allow_remote)}")
        if not self.allow_remote and not is_loopback_host(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address; serving beyond this machine "
                "needs allow_remote=True (there is no authentication or TLS)"
            )
        if not isinstance(self.model_name, str) or not self.model_name:
            raise TypeError(f"model_name must be a nonempty str, got "
                            f"{describe_value(self.model_name)}")
        require_int(self.max_active_requests, "max_active_requests", 1, UINT32_LIMIT)
        require_int(self.max_queued_requests, "max_queued_requests", 1, UINT32_LIMIT)
        require_int(self.prefill_chunk_tokens, "prefill_chunk_tokens", 1, UINT32_LIMIT)
        timeout = self.request_timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            math.isfinite(timeout) and timeout > 0
        ):
            raise ValueError(f"request_timeout_seconds must be finite and > 0, got "
                             f"{describe_value(timeout)}")
        require_int(self.max_connections, "max_connections", 1, 1 << 20)
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key
                                         or not self.api_key.isprintable()):
            raise ValueError("api_key must be a nonempty printable str (or None)")

    def pool_block_count(self, maximum_context: int) -> int:
        """The paged pool's size in blocks for a model of ``maximum_context`` tokens."""
        if self.kv_cache_block_count is not None:
            return self.kv_cache_block_count
        return self.max_active_requests * -(-maximum_context // self.kv_cache_block_size)


class ModelService:
    """One model, its tokenizer and a scheduler, with the serving limits applied.

    ``model`` is a model or an engine (see ``serving.engine``). Requests are validated here
    (ValueError/TypeError naming the field), then queued on the scheduler, which batches
    them. ``chat_template`` renders chat messages into the prompt and adds its stop
    sequences. A closed service raises RuntimeError.
    """

    def __init__(
        self,
        model,
        tokenizer,
        config: ServingConfig | None = None,
        chat_template: ChatTemplate | None = None,
    ) -> None:
        config = ServingConfig() if config is None else config
        if not isinstance(config, ServingConfig):
            raise TypeError(f"config must be a ServingConfig, not {type(config).__name__}")
        self._config = config
        self._chat_template = PlainChatTemplate() if chat_template is None else chat_template
        if is_engine(model):
            engine, owns_engine = model, False
        else:
            maximum_context = model.config.maximum_context
            engine = make_engine(
                model, kv_cache=config.kv_cache, block_size=config.kv_cache_block_size,
                block_count=config.pool_block_count(maximum_context),
            )
            owns_engine = True
        self._model = model
        self._engine = engine
        self._tokenizer = tokenizer
        self._token_bytes = TokenBytes(tokenizer)
        try:
            self._scheduler = Scheduler(
                engine, tokenizer,
                max_active_requests=config.max_active_requests,
                max_queued_requests=config.max_queued_requests,
                prefill_chunk_tokens=config.prefill_chunk_tokens,
                close_engine=owns_engine,
            )
        except BaseException:
            if owns_engine:
                engine.close()
            raise
        self._closed = False

    @property
    def config(self) -> ServingConfig:
        return self._config

    @property
    def engine(self):
        return self._engine

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def model_name(self) -> str:
        return self._config.model_name

    @property
    def closed(self) -> bool:
        return self._closed

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("ModelService is closed")

    def health(self) -> dict:
        """The service's state as a JSON-ready dict (the ``/health`` body)."""
        self._require_open()
        capacity = self._engine.capacity()
        stats = self._scheduler.stats()
        return {
            "status": "ok",
            "model": self.model_name,
            "artifact_id": None,  # no model bundles are loaded yet
            "artifact_stage": None,
            "backend": getattr(self._model, "backend", None),
            "engine": self._engine.kind,
            "vocabulary_size": self._engine.vocabulary_size,
            "maximum_context": self._engine.maximum_context,
            "maximum_new_tokens": self._config.maximum_new_tokens,
            "kv_cache": capacity.kv_cache,
            "kv_cache_block_size": capacity.block_size,
            "kv_cache_block_count": capacity.block_count,
            "kv_cache_free_block_count": capacity.available_block_count,
            "kv_cache_cached_block_count": capacity.cached_block_count,
            "active_requests": stats.active_count,
            "waiting_requests": stats.waiting_count,
        }

    @property
    def maximum_context(self) -> int:
        return self._engine.maximum_context

    @property
    def end_token_ids(self) -> tuple[int, ...]:
        """The ids that end a reply: the tokenizer's end token (``eos_id``) and the chat
        template's stop sequences that are single control tokens of the tokenizer (e.g.
        ``<|im_end|>``), in that order, each once."""
        ids: list[int] = []
        eos = getattr(self._tokenizer, "eos_id", None)
        if isinstance(eos, int) and not isinstance(eos, bool) and eos >= 0:
            ids.append(eos)
        listing = getattr(self._tokenizer, "control_tokens", None)
        if callable(listing):
            controls = listing()
            for stop in self._chat_template.stop_sequences:
                token = controls.get(stop)
                if isinstance(token, int) and token not in ids:
                    ids.append(token)
        sampled = tokenizer_vocabulary_size(self._tokenizer)
        return tuple(token for token in ids if token < sampled)

    def generation_config(
        self,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        stop: str | Sequence[str] = (),
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_p: float | None = None,
    ) -> GenerationConfig:
        """A GenerationConfig within this service's limits (ValueError/TypeError otherwise:
        e.g. ``max_new_tokens`` above ``maximum_new_tokens``, a negative temperature, or
        ``top_k`` with temperature 0)."""
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, seed=seed, stop=stop,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            min_p=min_p,
        )
        if (self._config.maximum_new_tokens is not None
                and config.max_new_tokens > self._config.maximum_new_tokens):
            raise ValueError(
                f"max_new_tokens must be at most {self._config.maximum_new_tokens} here, got "
                f"{config.max_new_tokens}"
            )
        # The ids sampling ranks: the tokenizer's (a padded model vocabulary is larger).
        sampled = tokenizer_vocabulary_size(self._tokenizer)
        if config.top_k is not None and config.top_k > sampled:
            raise ValueError(
                f"top_k must be at most the vocabulary size {sampled}, got {config.top_k}"
            )
        return config

    def encode(self, prompt) -> list[int]:
        """A prompt's token ids; ValueError for an empty prompt or one the tokenizer cannot
        encode (a byte tokenizer lacks some byte)."""
        self._require_open()
        try:
            return encode_prompt(self._tokenizer, prompt)
        except RiftcoTransformerError as error:
            raise ValueError(f"the tokenizer cannot encode the prompt ({error.detail})") from None

    def render_chat(self, messages: Sequence[ChatMessage | Mapping]) -> str:
        """The chat template's prompt for ``messages`` (ending with the assistant's header),
        as text to show: :meth:`chat` generates from :func:`~.chat.chat_prompt` instead,
        whose control tokens are the template's only."""
        return self._chat_template.render(messages, add_generation_prompt=True)

    def chat_config(self, config: GenerationConfig) -> GenerationConfig:
        """``config`` with the chat template's stop sequences added."""
        stops = tuple(config.stop) + tuple(
            stop for stop in self._chat_template.stop_sequences if stop not in config.stop
        )
        return config.replace(stop=stops)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token id (cached)."""
        return self._token_bytes(token_id)

    def prompt_text(self, token_ids: Sequence[int]) -> str:
        """A prompt's text as a result's ``prompt_text`` has it (its bytes, decoded with
        replacement characters)."""
        return lenient_utf8(self._token_bytes.of_ids(token_ids))

    def _require_within_limit(self, config: GenerationConfig) -> None:
        if (self._config.maximum_new_tokens is not None
                and config.max_new_tokens > self._config.maximum_new_tokens):
            raise ValueError(
                f"max_new_tokens must be at most {self._config.maximum_new_tokens} here, got "
                f"{config.max_new_tokens}"
            )

    def submit(self, prompt, config: GenerationConfig, on_event=None) -> RequestHandle:
        """Queue a generation (see :meth:`Scheduler.submit` for the errors)."""
        self._require_open()
        self._require_within_limit(config)
        return self._scheduler.submit(self.encode(prompt), config, on_event=on_event)

    def submit_group(self, prompt, configs: Sequence[GenerationConfig],
                     on_event=None) -> list[RequestHandle]:
        """Queue one generation per config over the same prompt, admitted together (see
        :meth:`Scheduler.submit_group` for the errors)."""
        self._require_open()
        for config in configs:
            self._require_within_limit(config)
        return self._scheduler.submit_group(self.encode(prompt), configs, on_event=on_event)

    def generate(
        self,
        prompt,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        stop: str | Sequence[str] = (),
        repetition_penalty: float = 1.0,
        on_token=None,
        timeout: float | None = None,
    ) -> GenerationResult:
        """Generate and wait for the result (``on_token(TokenEvent)`` sees each token)."""
        config = self.generation_config(max_new_tokens, temperature, top_k, top_p, seed, stop,
                                        repetition_penalty)
        handle = self.submit(prompt, config, on_event=on_token)
        try:
            return handle.result(timeout)
        finally:
            handle.cancel()  # a no-op when finished; frees the request after a timeout

    def chat(self, messages, on_token=None, timeout: float | None = None, **fields):
        """Generate the assistant's reply to ``messages`` (fields as for :meth:`generate`)."""
        config = self.chat_config(self.generation_config(**fields))
        prompt = chat_prompt(self._chat_template, self._tokenizer, messages)
        handle = self.submit(prompt, config, on_event=on_token)
        try:
            return handle.result(timeout)
        finally:
            handle.cancel()

    def close(self) -> None:
        """Stop the scheduler (pending requests fail) and close the engine it created."""
        if self._closed:
            return
        self._closed = True
        self._scheduler.close()

    def __enter__(self) -> ModelService:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()

