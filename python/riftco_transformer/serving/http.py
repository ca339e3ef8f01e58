"""The HTTP server: ``http.server.ThreadingHTTPServer`` in front of a ModelService.

Routes (anything else is 404; a known path with another method is 405 with ``Allow``):

=================================  ========================================================
``GET /``, ``GET /chat``           the chat page (``serving.chat_page``)
``GET /health``, ``/v1/health``    ``ModelService.health()``
``GET /v1/models[/<id>]``          OpenAI's model list (or one model)
``POST /v1/generate``              this server's generation API (``serving._protocol``)
``POST /v1/completions``           OpenAI completions
``POST /v1/chat/completions``      OpenAI chat completions
``GET /metrics``                   Prometheus text format (version 0.0.4): requests by
                                   route and status, token counts, durations, in flight,
                                   engine steps, prefix-cache hits, KV blocks by state
=================================  ========================================================

With ``"stream": true`` the generation routes answer with server-sent events: OpenAI's
chunk objects ending with ``data: [DONE]`` for the OpenAI routes (each carries its choice's
``index``; the choices of ``n > 1`` interleave as they are generated; a chat answer with
``tools`` is held back until its choice ends, then sent as that choice's role, content, tool
calls and finish chunks: ``serving._protocol``); for ``/v1/generate``,
``event: token`` per token (``{index, token_id, text, finish_reason}``) and a final
``event: result`` carrying the non-streamed response body (``event: error`` on failure).

Request rules: a body needs ``Content-Length`` (411 without one; 400 when it is not a
positive integer or the body is shorter; 413 above ``maximum_request_bytes``) and
``Content-Type: application/json`` (415; a charset other than UTF-8 too), and must be one
strict JSON object (400); requiring JSON also keeps cross-site form posts out (a browser
must preflight a JSON request, and the server grants no CORS). A server bound to loopback
answers 421 to a ``Host`` header naming anything else (DNS rebinding). Every error body is
``{"error": {message, type, param, code}}``, as OpenAI's are. Every response carries
``Cache-Control: no-store``, a CSP, ``X-Content-Type-Options: nosniff``,
``X-Frame-Options: DENY`` and ``Referrer-Policy: no-referrer``. A client that disconnects
while its request is generating (streamed or not) cancels the request (all its choices),
which frees its KV pages.

Connections are HTTP/1.1 persistent: every answer that is not streamed has a
``Content-Length`` and says ``Connection: keep-alive``, and the connection then waits for
the next request (the next request must arrive whole within ``request_timeout_seconds`` of
the previous answer; an idle connection is closed then without an answer). The server closes
it (``Connection: close``) when the client asks (``Connection: close``, or HTTP/1.0), after
a streamed answer (server-sent events end when the connection closes), after an error that
left a request body unread, and after the errors of the request line or headers.

With ``ServingConfig.api_key`` (``riftco serve --api-key``, or ``$RIFTCO_API_KEY``) every
``/v1/*`` route and ``/metrics`` need ``Authorization: Bearer <key>`` (compared in constant
time); otherwise the answer is 401 (code ``invalid_api_key``, ``WWW-Authenticate: Bearer``).
The chat page (``/``, ``/chat``) and ``/health`` stay open: the page asks for the key when
the server answers 401 and keeps it for the browser tab. There is no TLS: beyond loopback, a
key travels in clear text unless a TLS proxy stands in front.

Every request is logged as one INFO line on the ``riftco_transformer.serving.http`` logger:
``METHOD PATH STATUS DURATIONms`` and, for generation, ``prompt_tokens=P
completion_tokens=C``.

Limits against slow or abusive clients: at most ``max_connections`` connections are served
at once; one more is answered at once by a single background thread (no handler thread per
connection) with ``503`` (code ``server_busy``, ``Retry-After: 1``) and closed. The whole
request (request line, headers and body) must arrive within ``request_timeout_seconds`` of
the connection being taken, however the bytes are spaced: past that deadline the request
gets ``408`` (code ``request_timeout``). A body whose JSON nests deeper than the parser
allows is a ``400`` (``invalid_json``), like any other malformed JSON. A client that resets
or closes its connection before its answer is written costs one debug log line, never a
traceback.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import queue
import select
import selectors
import socket
import socketserver
import sys
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from .._container import reject_constant, unique_keys
from ._protocol import (
    ApiError,
    ApiRequest,
    OpenAIStream,
    generate_response,
    parse_chat,
    parse_completion,
    parse_generate,
)
from .chat_page import content_security_policy, new_nonce, render_chat_page
from .errors import (
    QueueFullError,
    RequestCancelledError,
    RequestRejectedError,
    SchedulerClosedError,
)
from .service import ModelService, ServingConfig, is_loopback_host

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0)

LOGGER = logging.getLogger(__name__)

JSON_CONTENT_SECURITY_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
DISCONNECT_POLL_SECONDS = 0.2
LINGER_SECONDS = 1.0
LINGER_BYTES = 16 << 20
REFUSED_LINGER_LIMIT = 256  # refused connections held for their linger, beyond: closed at once
REFUSED_POLL_SECONDS = 0.1

_ROUTES = {
    "/": {"GET": "_chat_page"},
    "/chat": {"GET": "_chat_page"},
    "/health": {"GET": "_health"},
    "/v1/health": {"GET": "_health"},
    "/v1/models": {"GET": "_models"},
    "/v1/generate": {"POST": "_generate"},
    "/v1/completions": {"POST": "_completions"},
    "/v1/chat/completions": {"POST": "_chat_completions"},
    "/metrics": {"GET": "_metrics"},
}
_MODEL_PREFIX = "/v1/models/"


class _ClientGone(Exception):
    """The client closed its connection; nothing more can be sent."""


class _RequestTimeout(Exception):
    """The request did not arrive whole within ``request_timeout_seconds``."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"the request did not arrive within {timeout:g} s "
                         f"(request_timeout_seconds)")


class _DeadlineReader(io.RawIOBase):
    """A connection's request bytes under one deadline for the whole request.

    Every read waits at most until ``timeout`` seconds after construction, then raises
    :class:`_RequestTimeout`; a request trickled a byte at a time is cut off at the same
    moment as one that stalls. After each read the connection's timeout is ``timeout``
    again, the per-operation bound on writing the response.
    """

    def __init__(self, connection: socket.socket, timeout: float) -> None:
        super().__init__()
        self._connection = connection
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self.received = 0  # bytes since the last restart

    def restart(self) -> None:
        """A fresh deadline (for the next request on a persistent connection)."""
        self._deadline = time.monotonic() + self._timeout
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _RequestTimeout(self._timeout)
        self._connection.settimeout(remaining)
        try:
            count = self._connection.recv_into(buffer)
            self.received += count
            return count
        except TimeoutError:
            raise _RequestTimeout(self._timeout) from None
        finally:
            self._connection.settimeout(self._timeout)


def _security_header_items(csp: str, close: bool = True) -> tuple[tuple[str, str], ...]:
    """The headers every response carries (see the module docstring)."""
    return (
        ("Cache-Control", "no-store"),
        ("Content-Security-Policy", csp),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
        ("Connection", "close" if close else "keep-alive"),
    )


def _json_bytes(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _error_response_bytes(error: ApiError, server_version: str) -> bytes:
    """A whole HTTP/1.1 response carrying ``error``'s JSON body, as a handler would send it."""
    data = _json_bytes(error.body())
    lines = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
             f"Server: {server_version}", f"Date: {formatdate(usegmt=True)}"]
    headers = (*_security_header_items(JSON_CONTENT_SECURITY_POLICY),
               ("Content-Type", "application/json"), ("Content-Length", str(len(data))),
               *error.headers)
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


class _Refuser:
    """Answers the connections over the server's cap, all on one thread.

    :meth:`refuse` (on the accepting thread, never blocking) writes the prepared answer,
    shuts the write side and hands the socket over; the thread reads and drops what the
    client still sends (at most ``LINGER_BYTES``, until it closes or ``LINGER_SECONDS``
    pass) so that the client reads the answer rather than a reset, then closes it. At most
    ``REFUSED_LINGER_LIMIT`` sockets linger; beyond that one is closed right after its
    answer. The thread starts with the first refusal and ends once nothing lingers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived: list[socket.socket] = []
        self._lingering = 0  # arrived and not yet closed
        self._thread: threading.Thread | None = None
        self._closed = False

    def refuse(self, connection: socket.socket, answer: bytes) -> None:
        try:
            connection.setblocking(False)
            connection.send(answer)  # a new connection's empty send buffer takes it whole
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            connection.close()
            return
        with self._lock:
            keep = not self._closed and self._lingering < REFUSED_LINGER_LIMIT
            if keep:
                self._lingering += 1
                self._arrived.append(connection)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="riftco-http-refused")
                    try:
                        self._thread.start()
                    except RuntimeError:  # no thread to be had: close instead of lingering
                        self._thread = None
                        self._arrived.remove(connection)
                        self._lingering -= 1
                        keep = False
        if not keep:
            connection.close()

    def close(self) -> None:
        """Close every lingering socket (within ``REFUSED_POLL_SECONDS``)."""
        with self._lock:
            self._closed = True

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        lingering: dict[socket.socket, list] = {}  # socket: [deadline, bytes drained]

        def finish(connection: socket.socket) -> None:
            try:
                selector.unregister(connection)
            except (KeyError, ValueError):
                pass
            del lingering[connection]
            connection.close()
            with self._lock:
                self._lingering -= 1

        try:
            while True:
                with self._lock:
                    arrived, self._arrived = self._arrived, []
                    done = self._closed or not (arrived or lingering)
                    if done:
                        self._thread = None
                for connection in arrived:
                    lingering[connection] = [time.monotonic() + LINGER_SECONDS, 0]
                    try:
                        selector.register(connection, selectors.EVENT_READ)
                    except (OSError, ValueError):
                        finish(connection)
                if done:
                    return
                for key, _ in selector.select(REFUSED_POLL_SECONDS):
                    connection = key.fileobj
                    try:
                        chunk = connection.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    lingering[connection][1] += len(chunk)
                    if not chunk or lingering[connection][1] >= LINGER_BYTES:
                        finish(connection)
                now = time.monotonic()
                for connection in [c for c, (deadline, _) in lingering.items() if deadline <= now]:
                    finish(connection)
        finally:
            for connection in list(lingering):
                finish(connection)
            selector.close()
            with self._lock:  # after a failure, the next refusal starts a new thread
                if self._thread is threading.current_thread():
                    self._thread = None


def _host_name(header: str) -> str:
    """The host part of a Host header (``[::1]:8000`` -> ``::1``, ``a:80`` -> ``a``)."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class ServerMetrics:
    """The counters ``/metrics`` exposes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = {}  # (route, method, code): count
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._buckets = [0] * len(DURATION_BUCKETS)
        self._duration_sum = 0.0
        self._duration_count = 0
        self._in_flight = 0

    def started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def record(self, route: str, method: str, code: int, seconds: float,
               prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        with self._lock:
            key = (route, method, code)
            self._requests[key] = self._requests.get(key, 0) + 1
            self._prompt_tokens += prompt_tokens
            self._completion_tokens += completion_tokens
            for index, bound in enumerate(DURATION_BUCKETS):
                if seconds <= bound:
                    self._buckets[index] += 1
            self._duration_sum += seconds
            self._duration_count += 1

    def exposition(self, service=None) -> str:
        """The Prometheus text exposition format, version 0.0.4; with ``service``, its
        scheduler's and KV pool's figures too."""
        engine_lines = [] if service is None else _engine_lines(service)
        with self._lock:
            lines = ["# HELP riftco_http_requests_total HTTP requests answered, by route, "
                     "method and status code.",
                     "# TYPE riftco_http_requests_total counter"]
            for (route, method, code), count in sorted(self._requests.items()):
                lines.append(f'riftco_http_requests_total{{route="{_label(route)}",'
                             f'method="{_label(method)}",code="{code}"}} {count}')
            lines += ["# HELP riftco_prompt_tokens_total Prompt tokens of answered "
                      "generation requests.",
                      "# TYPE riftco_prompt_tokens_total counter",
                      f"riftco_prompt_tokens_total {self._prompt_tokens}",
                      "# HELP riftco_completion_tokens_total Generated tokens of answered "
                      "generation requests.",
                      "# TYPE riftco_completion_tokens_total counter",
                      f"riftco_completion_tokens_total {self._completion_tokens}",
                      "# HELP riftco_http_request_duration_seconds Time from a request's "
                      "headers to the end of its answer.",
                      "# TYPE riftco_http_request_duration_seconds histogram"]
            for bound, count in zip(DURATION_BUCKETS, self._buckets, strict=True):
                lines.append(f'riftco_http_request_duration_seconds_bucket{{le="{bound:g}"}} '
                             f"{count}")
            lines += [f'riftco_http_request_duration_seconds_bucket{{le="+Inf"}} '
                      f"{self._duration_count}",
                      f"riftco_http_request_duration_seconds_sum {self._duration_sum!r}",
                      f"riftco_http_request_duration_seconds_count {self._duration_count}",
                      "# HELP riftco_http_requests_in_flight Requests being answered now.",
                      "# TYPE riftco_http_requests_in_flight gauge",
                      f"riftco_http_requests_in_flight {self._in_flight}"]
        return "\n".join(lines + engine_lines) + "\n"


def _engine_lines(service) -> list[str]:
    """The scheduler's counters and the KV pool's pages by state."""
    stats = service.scheduler.stats()
    capacity = service.engine.capacity()
    lines = ["# HELP riftco_engine_steps_total Batched engine steps, and those whose tokens the "
             "library chose inside the step.",
             "# TYPE riftco_engine_steps_total counter",
             f'riftco_engine_steps_total{{sampling="any"}} {stats.step_count}',
             f'riftco_engine_steps_total{{sampling="library"}} '
             f"{stats.library_sampled_step_count}",
             "# HELP riftco_prefill_tokens_total Prompt tokens prefilled, and those taken from "
             "the prefix cache instead.",
             "# TYPE riftco_prefill_tokens_total counter",
             f'riftco_prefill_tokens_total{{source="computed"}} {stats.prefill_token_count}',
             f'riftco_prefill_tokens_total{{source="prefix_cache"}} '
             f"{stats.prefix_reused_token_count}",
             "# HELP riftco_requests Requests running and waiting now.",
             "# TYPE riftco_requests gauge",
             f'riftco_requests{{state="running"}} {stats.active_count}',
             f'riftco_requests{{state="waiting"}} {stats.waiting_count}']
    if capacity.block_count is not None:
        lines += ["# HELP riftco_kv_blocks KV cache blocks of the pool, by state.",
                  "# TYPE riftco_kv_blocks gauge",
                  f'riftco_kv_blocks{{state="total"}} {capacity.block_count}',
                  f'riftco_kv_blocks{{state="reserved"}} {capacity.reserved_block_count}',
                  f'riftco_kv_blocks{{state="leased"}} {capacity.leased_block_count}',
                  f'riftco_kv_blocks{{state="cached"}} {capacity.cached_block_count}',
                  f'riftco_kv_blocks{{state="available"}} {capacity.available_block_count}']
    return lines


class ServingHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server for one :class:`ModelService`.

    Binds ``config.host:config.port`` (default: the service's config); a non-loopback host
    needs ``config.allow_remote`` (ValueError from ServingConfig). ``max_requests`` (None:
    no limit) shuts the server down once that many requests were handled. The server does
    not close the service.

    At most ``config.max_connections`` connections are served at once (see the module
    docstring); a refused connection does not count towards ``max_requests``.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops bursts of clients)

    def __init__(self, service: ModelService, config: ServingConfig | None = None, *,
                 max_requests: int | None = None) -> None:
        config = service.config if config is None else config
        if not isinstance(config, ServingConfig):
            raise TypeError(f"config must be a ServingConfig, not {type(config).__name__}")
        self.service = service
        self.serving_config = config
        self.loopback_only = is_loopback_host(config.host)
        self.created = int(time.time())
        self.max_requests = max_requests
        self._handled = 0
        self._handled_lock = threading.Lock()
        self._open_connections = 0
        self._connections_lock = threading.Lock()
        self._refusing = False
        self._refuser = _Refuser()
        self.metrics = ServerMetrics()
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        super().__init__((config.host.strip("[]"), config.port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS lookup); skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        """How many connections are being served now (refused ones not included)."""
        with self._connections_lock:
            return self._open_connections

    def process_request(self, request, client_address) -> None:
        """Serve the connection on a thread of its own, or refuse it at the cap."""
        limit = self.serving_config.max_connections
        with self._connections_lock:
            admitted = self._open_connections < limit
            if admitted:
                self._open_connections += 1
                self._refusing = False
            first_refusal = not admitted and not self._refusing
            if not admitted:
                self._refusing = True
        if not admitted:
            if first_refusal:
                LOGGER.warning("%d connections are open, the limit (max_connections): "
                               "refusing new ones with 503", limit)
            LOGGER.debug("%s refused: %d connections are open", client_address[0], limit)
            busy = ApiError(503, f"the server is serving {limit} connections, its limit "
                                 f"(max_connections); retry later", error_type="server_error",
                            code="server_busy", headers=(("Retry-After", "1"),))
            self._refuser.refuse(request, _error_response_bytes(busy, _Handler.server_version))
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_closed()
            raise

    def _connection_closed(self) -> None:
        with self._connections_lock:
            self._open_connections -= 1

    def handle_error(self, request, client_address) -> None:
        """A connection the client reset or abandoned is one debug line, not a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            LOGGER.debug("%s: connection lost: %r", client_address[0], error)
            return
        super().handle_error(request, client_address)

    def server_close(self) -> None:
        super().server_close()
        self._refuser.close()

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_closed()
            with self._handled_lock:
                self._handled += 1
                reached = self.max_requests is not None and self._handled == self.max_requests
            if reached:
                threading.Thread(target=self.shutdown, daemon=True).start()

    def serve_in_thread(self) -> threading.Thread:
        """Run ``serve_forever`` on a daemon thread (stop it with ``shutdown()``)."""
        thread = threading.Thread(target=self.serve_forever, args=(0.05,), name="riftco-http",
                                  daemon=True)
        thread.start()
        return thread


def make_server(service: ModelService, config: ServingConfig | None = None, *,
                max_requests: int | None = None) -> ServingHTTPServer:
    """A bound (not yet serving) :class:`ServingHTTPServer`."""
    return ServingHTTPServer(service, config, max_requests=max_requests)


class _Handler(BaseHTTPRequestHandler):
    server: ServingHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "riftco-transformer"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        self.timeout = self.server.serving_config.request_timeout_seconds
        super().setup()
        # One deadline for the whole request, not one per read (see _DeadlineReader).
        self._reader = _DeadlineReader(self.connection, self.timeout)
        per_read, self.rfile = self.rfile, io.BufferedReader(self._reader)
        per_read.close()
        self._answered = 0  # requests answered on this connection
        # What an answer needs before the request line is parsed (a 408 for a slow one).
        self.command, self.requestline, self.request_version = None, "", self.protocol_version
        self._body_pending = False  # request bytes were announced but not read
        self._headers_sent = False
        self._status: int | None = None

    def handle(self) -> None:
        try:
            try:
                super().handle()
            except _RequestTimeout as timeout:  # in the request line or headers
                if self._answered and not self._reader.received:
                    return  # an idle persistent connection: closed without an answer
                LOGGER.info("%s %s", self.address_string(), timeout)
                self.close_connection = True
                if not self._headers_sent:
                    self._send_json(408, ApiError(408, str(timeout),
                                                  code="request_timeout").body())
                self._linger()
        except ConnectionError as error:  # reset or closed before (or while) it was answered
            LOGGER.debug("%s: connection lost: %r", self.address_string(), error)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's signature
        LOGGER.info("%s %s", self.address_string(), format % args)

    def log_request(self, code="-", size="-") -> None:
        """Nothing: :meth:`handle_one_request` logs each request once, when it is answered."""

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def handle_one_request(self) -> None:
        if self._answered:
            self._reader.restart()
        self._status = None
        self._usage: tuple[int, int] | None = None
        self._route = "other"
        self._started = time.monotonic()
        try:
            super().handle_one_request()
        finally:
            if self._status is not None:
                self._answered += 1
                self._log_request()

    def _log_request(self) -> None:
        seconds = time.monotonic() - self._started
        prompt, completion = self._usage or (0, 0)
        self.server.metrics.record(self._route, self.command or "-", self._status, seconds,
                                   prompt, completion)
        tokens = ("" if self._usage is None else
                  f" prompt_tokens={prompt} completion_tokens={completion}")
        path = urlsplit(self.path).path if isinstance(getattr(self, "path", None), str) else "-"
        LOGGER.info("%s %s %s %d %.1fms%s", self.address_string(), self.command or "-", path,
                    self._status, seconds * 1000, tokens)

    # ---- dispatch ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        self.server.metrics.started()
        try:
            self._route_request()
        finally:
            self.server.metrics.finished()

    def _route_request(self) -> None:
        self._headers_sent = False
        # Until a route reads it, an announced body is unread (see _linger).
        length = self.headers.get("Content-Length", "0").strip()
        self._body_pending = self.headers.get("Transfer-Encoding") is not None or not (
            length.isdigit() and int(length) == 0)
        try:
            self._check_host()
            path = unquote(urlsplit(self.path).path)
            if path.startswith(_MODEL_PREFIX) and len(path) > len(_MODEL_PREFIX):
                methods = {"GET": "_model"}
                self._route = _MODEL_PREFIX + "{id}"
            else:
                methods = _ROUTES.get(path)
                if methods is not None:
                    self._route = path
            if path.startswith("/v1/") or path == "/metrics":
                self._check_api_key()
            if methods is None:
                raise ApiError(404, f"there is no route {path!r}", code="not_found")
            handler = methods.get(self.command)
            if handler is None:
                allowed = ", ".join(methods)
                raise ApiError(405, f"{path} accepts {allowed}, not {self.command}",
                               code="method_not_allowed", headers=(("Allow", allowed),))
            getattr(self, handler)(path)
        except ApiError as error:
            if not self._headers_sent:
                self._send_json(error.status, error.body(), error.headers)
        except _ClientGone:
            LOGGER.info("%s disconnected during %s %s", self.address_string(), self.command,
                        self.path)
        except ConnectionError as error:  # BrokenPipeError, ConnectionResetError, ...
            LOGGER.debug("%s: connection lost during %s %s: %r", self.address_string(),
                         self.command, self.path, error)
        except Exception:  # noqa: BLE001 - answer 500 and log, never kill the server thread
            LOGGER.exception("%s %s failed", self.command, self.path)
            if not self._headers_sent:
                error = ApiError(500, "internal server error", error_type="server_error")
                self._send_json(500, error.body())
        finally:
            if self._body_pending:
                self._linger()

    def _check_api_key(self) -> None:
        key = self.server.serving_config.api_key
        if key is None:
            return
        scheme, _, given = (self.headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("utf-8", "surrogateescape"), key.encode("utf-8")):
            raise ApiError(401, "a valid API key is required: send the header "
                                "'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers=(("WWW-Authenticate", "Bearer"),))

    def _check_host(self) -> None:
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            raise ApiError(400, "more than one Host header", code="bad_host")
        if hosts and self.server.loopback_only and not is_loopback_host(_host_name(hosts[0])):
            raise ApiError(421, f"this server only answers requests for its loopback address, "
                                f"not Host {hosts[0]!r}", code="misdirected_request")

    # ---- responses ---------------------------------------------------------------------------

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """The base class's own errors (a bad request line, 414, 431, 501...) as JSON too."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        text = message or phrase
        if explain:
            text = f"{text}: {explain}"
        self._send_json(code, ApiError(code, text).body())

    def _security_headers(self, content_security_policy: str) -> None:
        if self._body_pending:  # an unread body: the connection is closed after the answer
            self.close_connection = True
        for name, value in _security_header_items(content_security_policy,
                                                  self.close_connection):
            self.send_header(name, value)

    def _send_body(self, status: int, content_type: str, data: bytes, csp: str,
                   headers=()) -> None:
        self.send_response(status)
        self._security_headers(csp)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self._headers_sent = True
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_json(self, status: int, body: dict, headers=()) -> None:
        self._send_body(status, "application/json", _json_bytes(body),
                        JSON_CONTENT_SECURITY_POLICY, headers)

    def _start_events(self) -> None:
        self.close_connection = True  # the events end when the connection closes
        self.send_response(200)
        self._security_headers(JSON_CONTENT_SECURITY_POLICY)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()  # no Content-Length: the body ends when the connection closes
        self._headers_sent = True

    def _send_event(self, data, event: str | None = None) -> None:
        payload = data if isinstance(data, str) else json.dumps(
            data, ensure_ascii=False, separators=(",", ":"))
        frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        try:
            self.wfile.write(frame.encode("utf-8"))
        except OSError as error:  # BrokenPipeError, ConnectionResetError, a timeout
            raise _ClientGone() from error

    def _linger(self) -> None:
        """Read and drop the unread request body (bounded) before closing, so the client
        gets the error response instead of a reset connection."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            deadline = time.monotonic() + LINGER_SECONDS
            drained = 0
            while drained < LINGER_BYTES and time.monotonic() < deadline:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    # ---- request bodies ----------------------------------------------------------------------

    def _read_json_body(self) -> dict:
        limit = self.server.serving_config.maximum_request_bytes
        if self.headers.get("Transfer-Encoding") is not None:
            raise ApiError(411, "chunked request bodies are not accepted; send Content-Length",
                           code="length_required")
        lengths = self.headers.get_all("Content-Length")
        if not lengths:
            raise ApiError(411, "Content-Length is required", code="length_required")
        if len(set(lengths)) != 1 or not lengths[0].strip().isdigit():
            raise ApiError(400, f"Content-Length must be one positive integer, got "
                                f"{', '.join(lengths)!r}", code="bad_content_length")
        length = int(lengths[0])
        if length == 0:
            raise ApiError(400, "the request body is empty", code="bad_content_length")
        if length > limit:
            raise ApiError(413, f"the request body has {length} bytes; the limit is {limit}",
                           code="request_too_large")
        content_type = self.headers.get("Content-Type", "")
        media_type, _, parameters = content_type.partition(";")
        charset = next((value.strip().strip('"').lower() for key, _, value in
                        (item.strip().partition("=") for item in parameters.split(";"))
                        if key.strip().lower() == "charset"), "utf-8")
        if media_type.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
            raise ApiError(415, f"the body must be application/json (UTF-8), not "
                                f"{content_type or 'untyped'!r}", code="unsupported_media_type")
        try:
            data = self.rfile.read(length)
        except _RequestTimeout as timeout:
            raise ApiError(408, str(timeout), code="request_timeout") from None
        self._body_pending = False
        if len(data) != length:
            raise ApiError(400, f"the body has {len(data)} of its {length} announced bytes",
                           code="incomplete_body")
        try:
            body = json.loads(data.decode("utf-8"), parse_constant=reject_constant,
                              object_pairs_hook=unique_keys)
        except (UnicodeDecodeError, ValueError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}",
                           code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the body's JSON nests arrays or objects deeper than this "
                                "server parses", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return body

    # ---- routes ------------------------------------------------------------------------------

    def _chat_page(self, path: str) -> None:
        nonce = new_nonce()
        service = self.server.service
        limit = service.config.maximum_new_tokens
        page = render_chat_page(nonce, service.model_name,
                                service.maximum_context if limit is None else limit)
        self._send_body(200, "text/html; charset=utf-8", page.encode("utf-8"),
                        content_security_policy(nonce))

    def _health(self, path: str) -> None:
        try:
            health = self.server.service.health()
        except RuntimeError as error:  # a closed service
            raise ApiError(503, str(error), error_type="server_error",
                           code="unavailable") from None
        self._send_json(200, health)

    def _model_object(self) -> dict:
        return {"id": self.server.service.model_name, "object": "model",
                "created": self.server.created, "owned_by": "riftco-transformer"}

    def _metrics(self, path: str) -> None:
        self._send_body(200, METRICS_CONTENT_TYPE,
                        self.server.metrics.exposition(self.server.service).encode("utf-8"),
                        JSON_CONTENT_SECURITY_POLICY)

    def _models(self, path: str) -> None:
        self._send_json(200, {"object": "list", "data": [self._model_object()]})

    def _model(self, path: str) -> None:
        name = path[len(_MODEL_PREFIX):]
        if name != self.server.service.model_name:
            raise ApiError(404, f"the model {name!r} does not exist", param="model",
                           code="model_not_found")
        self._send_json(200, self._model_object())

    def _generate(self, path: str) -> None:
        self._generation(parse_generate)

    def _completions(self, path: str) -> None:
        self._generation(parse_completion)

    def _chat_completions(self, path: str) -> None:
        self._generation(parse_chat)

    # ---- generation --------------------------------------------------------------------------

    def _generation(self, parse) -> None:
        service = self.server.service
        request = parse(self._read_json_body(), service)
        if request.route != "generate":
            self._openai_generation(request)
            return
        handle = self._submit(request)
        try:
            if request.stream:
                self._stream(request, handle)
            else:
                result = self._await_result(handle)
                self._usage = (len(result.prompt_token_ids), len(result.generated_token_ids))
                self._send_json(200, generate_response(service, request, result))
        finally:
            handle.cancel()  # no-op once finished; frees a request whose client went away

    def _openai_generation(self, request: ApiRequest) -> None:
        """An OpenAI route's ``n`` choices: one scheduler group, every handle cancelled when
        the answer ends (a no-op for the finished ones)."""
        items: queue.SimpleQueue = queue.SimpleQueue()  # (choice, event or None: it ended)
        callbacks = [lambda event, index=index: items.put((index, event))
                     for index in range(request.n)] if request.stream else None
        handles = self._submit(request, callbacks)
        try:
            if request.stream:
                for index, handle in enumerate(handles):
                    handle.add_done_callback(lambda _, index=index: items.put((index, None)))
                self._stream_choices(request, handles, items)
            else:
                results = [self._await_result(handle) for handle in handles]
                self._usage = self._choices_usage(results)
                self._send_json(200, OpenAIStream(self.server.service, request).response(
                    results))
        finally:
            for handle in handles:
                handle.cancel()

    @staticmethod
    def _choices_usage(results) -> tuple[int, int]:
        return (len(results[0].prompt_token_ids),
                sum(len(result.generated_token_ids) for result in results))

    def _submit(self, request: ApiRequest, on_event=None):
        """The request's handle (``/v1/generate``), or its choices' handles (OpenAI: one
        request when ``n`` is 1, else a group)."""
        service = self.server.service
        try:
            if request.route == "generate":
                return service.submit(request.prompt, request.config)
            if request.n == 1:
                return [service.submit(request.prompt, request.config,
                                       on_event=on_event[0] if on_event else None)]
            return service.submit_group(request.prompt, request.choice_configs(),
                                        on_event=on_event)
        except RequestRejectedError as error:
            raise ApiError(400, str(error), param=error.param,
                           code="request_too_large") from None
        except QueueFullError as error:
            raise ApiError(503, str(error), error_type="server_error", code="server_busy",
                           headers=(("Retry-After", "1"),)) from None
        except (TypeError, ValueError) as error:
            raise ApiError(400, str(error), param="prompt", code="invalid_value") from None
        except (SchedulerClosedError, RuntimeError) as error:
            raise ApiError(503, str(error), error_type="server_error",
                           code="unavailable") from None

    def _client_gone(self) -> bool:
        """Whether the client closed its side (readable with no data left to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _generation_error(self, error: BaseException) -> ApiError:
        if isinstance(error, SchedulerClosedError):
            return ApiError(503, "the server is shutting down", error_type="server_error",
                            code="unavailable")
        if isinstance(error, RequestCancelledError):
            return ApiError(503, "the request was cancelled", error_type="server_error",
                            code="cancelled")
        LOGGER.error("generation failed: %r", error, exc_info=error)
        return ApiError(500, "generation failed", error_type="server_error",
                        code="generation_failed")

    def _await_result(self, handle):
        while True:
            try:
                return handle.result(timeout=DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                if self._client_gone():
                    handle.cancel()
                    raise _ClientGone() from None
            except Exception as error:  # noqa: BLE001 - the request's own failure
                raise self._generation_error(error) from None

    def _next_event(self, handle):
        while True:
            try:
                return handle.next_event(timeout=DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                if self._client_gone():
                    handle.cancel()
                    raise _ClientGone() from None

    def _stream(self, request: ApiRequest, handle) -> None:
        """``/v1/generate`` streamed: a token event per token, then the result."""
        service = self.server.service
        self._start_events()
        try:
            while (event := self._next_event(handle)) is not None:
                self._send_event({"index": event.index, "token_id": event.token_id,
                                  "text": event.text, "finish_reason": event.finish_reason},
                                 "token")
            result = handle.result()
            self._usage = (len(result.prompt_token_ids), len(result.generated_token_ids))
        except _ClientGone:
            handle.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - the request failed mid-stream
            self._send_event(self._generation_error(error).body(), "error")
            return
        self._send_event(generate_response(service, request, result), "result")

    def _next_item(self, items: queue.SimpleQueue, handles):
        """The next (choice, event or None) of a streamed OpenAI answer, watching for the
        client's disconnection meanwhile (which cancels every choice)."""
        while True:
            try:
                return items.get(timeout=DISCONNECT_POLL_SECONDS)
            except queue.Empty:
                if self._client_gone():
                    for handle in handles:
                        handle.cancel()
                    raise _ClientGone() from None

    def _stream_choices(self, request: ApiRequest, handles, items: queue.SimpleQueue) -> None:
        """An OpenAI route streamed: each chat choice's role, then every choice's chunks as
        its events come (its finish chunk when it ends), the usage when asked, ``[DONE]``."""
        openai = OpenAIStream(self.server.service, request)
        self._start_events()
        results = [None] * len(handles)
        try:
            for chunk in openai.opening_chunks():
                self._send_event(chunk)
            remaining = len(handles)
            while remaining:
                index, event = self._next_item(items, handles)
                if event is not None:
                    for chunk in openai.event_chunks(index, event):
                        self._send_event(chunk)
                    continue
                results[index] = handles[index].result()  # raises the choice's failure
                remaining -= 1
                for chunk in openai.finish_chunks(index, results[index]):
                    self._send_event(chunk)
            self._usage = self._choices_usage(results)
        except _ClientGone:
            for handle in handles:
                handle.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - a choice failed mid-stream
            self._send_event(self._generation_error(error).body())
            self._send_event("[DONE]")
            return
        if request.include_usage:
            self._send_event(openai.usage_chunk(results))
        self._send_event("[DONE]")


def serve(service: ModelService, config: ServingConfig | None = None, *,
          max_requests: int | None = None, ready=None) -> None:
    """Serve until interrupted (Ctrl-C) or until ``max_requests`` were handled.

    ``ready(server)``, when given, is called once the socket is bound (e.g. to print the
    URL). The service stays open.
    """
    with make_server(service, config, max_requests=max_requests) as server:
        if ready is not None:
            ready(server)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
