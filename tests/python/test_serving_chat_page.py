"""The chat page in a real browser: headless Chromium, driven over the DevTools protocol
(a small stdlib WebSocket client below), types two messages and watches the replies stream
in. Skipped when no ``chromium`` is installed. Bounded: the browser is killed after
``DEADLINE`` seconds at the latest."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TINY_CONFIG

from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    ModelService,
    PlainChatTemplate,
    ServingConfig,
    TextGenerator,
    make_server,
)

DEADLINE = 45.0
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-dev-shm-usage", "--no-default-browser-check",
    "--remote-debugging-port=0",
)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: masked text frames out,
    (possibly fragmented) text frames in."""

    def __init__(self, url: str, timeout: float) -> None:
        assert url.startswith("ws://")
        address, _, path = url[len("ws://"):].partition("/")
        host, _, port = address.rpartition(":")
        self._socket = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self._socket.sendall(
            f"GET /{path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self._socket.recv(4096)
            if not chunk:
                raise ConnectionError("the DevTools socket closed during the handshake")
            response += chunk
        head, _, self._buffer = response.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"WebSocket handshake refused: {head[:200]!r}")

    def send(self, text: str) -> None:
        payload = text.encode("utf-8")
        header = bytearray([0x81])  # FIN, text
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
        mask = os.urandom(4)
        masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
        self._socket.sendall(bytes(header) + mask + masked)

    def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            chunk = self._socket.recv(65536)
            if not chunk:
                raise ConnectionError("the DevTools socket closed")
            self._buffer += chunk
        data, self._buffer = self._buffer[:count], self._buffer[count:]
        return data

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the DevTools socket sent a close frame")
            if opcode in (0x9, 0xA):  # ping / pong: nothing to keep
                continue
            message += payload
            if first & 0x80:
                return message.decode("utf-8")

    def close(self) -> None:
        self._socket.close()


class DevToolsPage:
    def __init__(self, websocket_url: str, timeout: float) -> None:
        self._socket = WebSocket(websocket_url, timeout)
        self._next_id = 0
        self.events: list[dict] = []

    def command(self, method: str, **params) -> dict:
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.receive())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def evaluate(self, expression: str):
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self._socket.close()


def wait_for(predicate, deadline: float, what: str):
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


PAGE_STATE = """JSON.stringify({
  state: document.body.dataset.state,
  chunks: Number(document.body.dataset.chunks),
  bubbles: Array.from(document.querySelectorAll(".message"),
                      (b) => [b.className, b.textContent]),
})"""


def send_message(page: DevToolsPage, text: str) -> None:
    page.evaluate(f"""(() => {{
      document.getElementById("prompt").value = {json.dumps(text)};
      document.getElementById("composer").requestSubmit();
      return true;
    }})()""")


def test_the_chat_page_streams_replies_and_sends_the_whole_transcript(tmp_path: Path):
    deadline = time.monotonic() + DEADLINE
    tokenizer = Tokenizer("### User:\n### Assistant:\nabcdefghijklmnopqrstuvwxyz .,!?")
    model = DecoderOnlyTransformer(
        dataclasses.replace(TINY_CONFIG, vocabulary_size=tokenizer.vocab_size))
    config = ServingConfig(port=0, model_name="riftco-browser-test", maximum_new_tokens=12)
    template = PlainChatTemplate()
    with model, tokenizer, ModelService(model, tokenizer, config) as service:
        reference = TextGenerator(FullForwardEngine(model), tokenizer)
        chat_config = GenerationConfig(max_new_tokens=12, stop=template.stop_sequences)
        prompts: list[str] = []
        submit = service.submit

        def recording_submit(prompt, generation_config, on_event=None):
            prompts.append(prompt)
            return submit(prompt, generation_config, on_event=on_event)

        service.submit = recording_submit
        with make_server(service) as server:
            server.serve_in_thread()
            profile = tmp_path / "chromium-profile"
            browser = subprocess.Popen(
                [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", server.url + "/"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            page = None
            try:
                port_file = profile / "DevToolsActivePort"
                wait_for(port_file.exists, deadline, "Chromium's DevTools port")
                port = int(wait_for(lambda: port_file.read_text().split("\n")[0], deadline,
                                    "the DevTools port number"))

                def page_target():
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                                timeout=5) as listing:
                        targets = json.load(listing)
                    return next((t for t in targets if t.get("type") == "page"
                                 and t.get("url", "").startswith(server.url)), None)

                target = wait_for(page_target, deadline, "the chat page's target")
                page = DevToolsPage(target["webSocketDebuggerUrl"], timeout=10)
                page.command("Runtime.enable")
                page.command("Log.enable")
                def script_ran() -> bool:
                    try:  # the page may still be loading (no body, or a fresh context)
                        return page.evaluate("document.body.dataset.ready === 'true'")
                    except RuntimeError:
                        return False

                wait_for(script_ran, deadline, "the page's script to run (under its CSP)")

                history: list[dict] = []
                for index, text in enumerate(["hi", "and more"]):
                    history.append({"role": "user", "content": text})
                    expected = reference.generate(template.render(history), chat_config)
                    send_message(page, text)
                    state = wait_for(lambda: (lambda s: s if s["state"] == "idle" and len(
                        s["bubbles"]) == 2 * (index + 1) else None)(json.loads(
                            page.evaluate(PAGE_STATE))), deadline, f"reply {index + 1}")
                    assert state["bubbles"][-2] == ["message user", text]
                    assert state["bubbles"][-1] == ["message assistant", expected.generated_text]
                    assert state["chunks"] > 1  # the reply arrived in several deltas
                    assert prompts[-1] == template.render(history)
                    history.append({"role": "assistant", "content": expected.generated_text})
                assert len(prompts) == 2
                problems = [event for event in page.events
                            if event.get("method") == "Runtime.exceptionThrown"
                            or "Refused to" in json.dumps(event)]
                assert problems == []
            finally:
                if page is not None:
                    page.close()
                os.killpg(browser.pid, signal.SIGKILL)
                browser.wait(10)
                server.shutdown()
    assert time.monotonic() < deadline
