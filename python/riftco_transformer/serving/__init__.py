"""Serving: generation, continuous batching and an HTTP API over the native models.

Standard library only. The layers, each usable on its own:

* :mod:`.engine`: the narrow :class:`Engine` interface (open a stream, one batched step,
  free) and its two implementations, :class:`NativeEngine` (the library's KV-cache decode
  sessions over one shared paged pool) and :class:`FullForwardEngine` (any model, one full
  forward per step); :func:`make_engine` picks one.
* :mod:`.sampling`: :class:`Greedy` and :class:`TemperatureSampler` (top-k, top-p,
  repetition penalty).
* :mod:`.generation`: :class:`GenerationConfig`, :class:`TextGenerator` (one request at a
  time, streamed or not), :class:`GenerationResult`, :class:`TokenEvent`.
* :mod:`.chat`: the :class:`ChatTemplate` protocol and :class:`PlainChatTemplate`.
* :mod:`.scheduler`: :class:`Scheduler`, continuous batching on one background thread.
* :mod:`.service` and :mod:`.http`: :class:`ModelService` (a model behind a scheduler with
  :class:`ServingConfig`'s limits) and :class:`ServingHTTPServer` (health, our generation
  API, OpenAI-compatible completions and chat completions with streaming, a chat page).
"""

from .chat import ChatMessage, ChatTemplate, PlainChatTemplate
from .engine import (
    Admission,
    Engine,
    EngineStream,
    FullForwardEngine,
    KvCapacity,
    NativeEngine,
    make_engine,
    native_decode_available,
)
from .errors import (
    PoolFullError,
    QueueFullError,
    RequestCancelledError,
    RequestRejectedError,
    SchedulerClosedError,
)
from .generation import (
    GenerationConfig,
    GenerationResult,
    GenerationStream,
    TextGenerator,
    TokenEvent,
)
from .http import ServingHTTPServer, make_server, serve
from .sampling import Greedy, Sampler, TemperatureSampler, apply_repetition_penalty
from .scheduler import RequestHandle, Scheduler, SchedulerStats
from .service import ModelService, ServingConfig

__all__ = [
    "Admission",
    "ChatMessage",
    "ChatTemplate",
    "Engine",
    "EngineStream",
    "FullForwardEngine",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStream",
    "Greedy",
    "KvCapacity",
    "ModelService",
    "NativeEngine",
    "PlainChatTemplate",
    "PoolFullError",
    "QueueFullError",
    "RequestCancelledError",
    "RequestHandle",
    "RequestRejectedError",
    "Sampler",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerStats",
    "ServingConfig",
    "ServingHTTPServer",
    "TemperatureSampler",
    "TextGenerator",
    "TokenEvent",
    "apply_repetition_penalty",
    "make_engine",
    "make_server",
    "native_decode_available",
    "serve",
]
