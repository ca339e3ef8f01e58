"""The HTTP server: ``http.server.ThreadingHTTPServer`` in front of a ModelService.

Routes (anything else is 404; a known path with another method is 405 with ``Allow``):

=================================  ========================================================
``GET /``, ``GET /chat``           the chat page (``serving.chat_page``)
``GET /health``, ``/v1/health``    ``ModelService.health()``
``GET /v1/models[/<id>]``          OpenAI's model list (or one model)
``POST /v1/generate``              this server's generation API (``serving._protocol``)
``POST /v1/completions``           OpenAI completions
``POST /v1/chat/completions``      OpenAI chat completions
=================================  ========================================================

With ``"stream": true`` the generation routes answer with server-sent events: OpenAI's
chunk objects ending with ``data: [DONE]`` for the OpenAI routes; for ``/v1/generate``,
``event: token`` per token (``{index, token_id, text, finish_reason}``) and a final
``event: result`` carrying the non-streamed response body (``event: error`` on failure).

Request rules: a body needs ``Content-Length`` (411 without one; 400 when it is not a
positive integer or the body is shorter; 413 above ``maximum_request_bytes``) and
``Content-Type: application/json`` (415; a charset other than UTF-8 too), and must be one
strict JSON object (400); requiring JSON also keeps cross-site form posts out (a browser
must preflight a JSON request, and the server grants no CORS). A server bound to loopback
answers 421 to a ``Host`` header naming anything else (DNS rebinding). Every error body is
``{"error": {message, type, param, code}}``, as OpenAI's are. Every response carries ``Cache-Control: no-store``, a CSP,
``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy:
no-referrer`` and ``Connection: close``. A client that disconnects while its request is
generating (streamed or not) cancels the request, which frees its KV pages. There is no
authentication and no TLS: expose the server beyond loopback only on a trusted network.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import socketserver
import threading
import time
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

LOGGER = logging.getLogger(__name__)

JSON_CONTENT_SECURITY_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
DISCONNECT_POLL_SECONDS = 0.2
LINGER_SECONDS = 1.0
LINGER_BYTES = 16 << 20

_ROUTES = {
    "/": {"GET": "_chat_page"},
    "/chat": {"GET": "_chat_page"},
    "/health": {"GET": "_health"},
    "/v1/health": {"GET": "_health"},
    "/v1/models": {"GET": "_models"},
    "/v1/generate": {"POST": "_generate"},
    "/v1/completions": {"POST": "_completions"},
    "/v1/chat/completions": {"POST": "_chat_completions"},
}
_MODEL_PREFIX = "/v1/models/"


class _ClientGone(Exception):
    """The client closed its connection; nothing more can be sent."""


def _host_name(header: str) -> str:
    """The host part of a Host header (``[::1]:8000`` -> ``::1``, ``a:80`` -> ``a``)."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class ServingHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server for one :class:`ModelService`.

    Binds ``config.host:config.port`` (default: the service's config); a non-loopback host
    needs ``config.allow_remote`` (ValueError from ServingConfig). ``max_requests`` (None:
    no limit) shuts the server down once that many requests were handled. The server does
    not close the service.
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

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
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
        self._body_pending = False  # request bytes were announced but not read
        self._headers_sent = False

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's signature
        LOGGER.info("%s %s", self.address_string(), format % args)

    # ---- dispatch ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        self.close_connection = True
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
            else:
                methods = _ROUTES.get(path)
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
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # noqa: BLE001 - answer 500 and log, never kill the server thread
            LOGGER.exception("%s %s failed", self.command, self.path)
            if not self._headers_sent:
                error = ApiError(500, "internal server error", error_type="server_error")
                self._send_json(500, error.body())
        finally:
            if self._body_pending:
                self._linger()

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
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", content_security_policy)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Connection", "close")

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
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self._send_body(status, "application/json", data, JSON_CONTENT_SECURITY_POLICY, headers)

    def _start_events(self) -> None:
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
        except TimeoutError:
            raise ApiError(408, "the request body did not arrive in time",
                           code="request_timeout") from None
        self._body_pending = False
        if len(data) != length:
            raise ApiError(400, f"the body has {len(data)} of its {length} announced bytes",
                           code="incomplete_body")
        try:
            body = json.loads(data.decode("utf-8"), parse_constant=reject_constant,
                              object_pairs_hook=unique_keys)
        except (UnicodeDecodeError, ValueError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}", code="invalid_json")
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return body

    # ---- routes ------------------------------------------------------------------------------

    def _chat_page(self, path: str) -> None:
        nonce = new_nonce()
        service = self.server.service
        page = render_chat_page(nonce, service.model_name, service.config.maximum_new_tokens)
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
        handle = self._submit(request)
        try:
            if request.stream:
                self._stream(request, handle)
            else:
                result = self._await_result(handle)
                if request.route == "generate":
                    self._send_json(200, generate_response(service, request, result))
                else:
                    self._send_json(200, OpenAIStream(service, request).response(result))
        finally:
            handle.cancel()  # no-op once finished; frees a request whose client went away

    def _submit(self, request: ApiRequest):
        try:
            return self.server.service.submit(request.prompt, request.config)
        except RequestRejectedError as error:
            raise ApiError(400, str(error), code="request_too_large") from None
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
        service = self.server.service
        self._start_events()
        openai = None if request.route == "generate" else OpenAIStream(service, request)
        try:
            if openai is not None and openai.chat:
                self._send_event(openai.chunk("", role=True))
            while (event := self._next_event(handle)) is not None:
                if openai is None:
                    self._send_event({"index": event.index, "token_id": event.token_id,
                                      "text": event.text, "finish_reason": event.finish_reason},
                                     "token")
                elif event.text:
                    self._send_event(openai.chunk(event.text))
            result = handle.result()
        except _ClientGone:
            handle.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - the request failed mid-stream
            failure = self._generation_error(error)
            self._send_event(failure.body(), "error" if openai is None else None)
            if openai is not None:
                self._send_event("[DONE]")
            return
        if openai is None:
            self._send_event(generate_response(service, request, result), "result")
            return
        self._send_event(openai.chunk(None, result.finish_reason))
        if request.include_usage:
            self._send_event(openai.usage_chunk(result))
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
