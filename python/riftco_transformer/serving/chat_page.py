"""The self-contained chat page served at ``GET /``: one HTML document, no external assets.

The page keeps the conversation in the browser and sends the whole transcript as
``messages`` to ``POST /v1/chat/completions`` with ``stream: true``, appending each streamed
delta to the assistant's bubble as it arrives (text is only ever set with ``textContent``).
Its inline script and style carry a per-response nonce that the response's
Content-Security-Policy names (:func:`content_security_policy`); nothing else may run or
load. ``document.body.dataset`` exposes ``state`` (``idle``, ``streaming``, ``error``) and
``chunks`` (deltas received in the last answer) for tests and tools, and ``ready`` once the
script has run.
"""

from __future__ import annotations

import html
import json
import secrets


def new_nonce() -> str:
    return secrets.token_urlsafe(18)


def content_security_policy(nonce: str) -> str:
    """The page's CSP: its own nonce-tagged script and style, requests to its origin only."""
    return (
        "default-src 'none'; "
        f"script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def _script_json(value) -> str:
    """A JSON literal safe inside an inline <script> (no "</script>" or HTML comment)."""
    return (
        json.dumps(value)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


def render_chat_page(nonce: str, model_name: str, maximum_new_tokens: int) -> str:
    """The chat page's HTML for one response."""
    default_tokens = min(64, maximum_new_tokens)
    return (
        _PAGE.replace("@NONCE@", html.escape(nonce, quote=True))
        .replace("@TITLE@", html.escape(model_name))
        .replace("@MAX_TOKENS@", str(maximum_new_tokens))
        .replace("@DEFAULT_TOKENS@", str(default_tokens))
        .replace("@MODEL_JSON@", _script_json(model_name))
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@ chat</title>
<style nonce="@NONCE@">
  :root { color-scheme: light dark; --accent: #3b6fd8; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, sans-serif; display: flex; flex-direction: column;
         height: 100vh; }
  header { padding: .6rem 1rem; border-bottom: 1px solid #8884; display: flex; gap: 1rem;
           align-items: baseline; }
  header h1 { font-size: 1.05rem; margin: 0; }
  #status { color: #888; font-size: .85rem; }
  #transcript { flex: 1; overflow-y: auto; padding: 1rem; display: flex; flex-direction: column;
                gap: .6rem; }
  .message { max-width: 48rem; padding: .5rem .75rem; border-radius: .6rem;
             white-space: pre-wrap; overflow-wrap: anywhere; }
  .message.user { align-self: flex-end; background: var(--accent); color: white; }
  .message.assistant { align-self: flex-start; background: #8882; }
  .message.error { outline: 2px solid #d33; }
  form { border-top: 1px solid #8884; padding: .75rem 1rem; display: flex; flex-direction: column;
         gap: .5rem; }
  textarea { width: 100%; font: inherit; padding: .5rem; resize: vertical; }
  .controls { display: flex; flex-wrap: wrap; gap: .75rem; align-items: center; }
  .controls input { width: 5.5rem; }
  button { font: inherit; padding: .35rem .9rem; }
</style>
</head>
<body data-state="idle" data-chunks="0">
<header><h1>@TITLE@</h1><span id="status">ready</span></header>
<main id="transcript" aria-live="polite"></main>
<form id="composer">
  <textarea id="prompt" rows="3" placeholder="Message (Enter sends, Shift+Enter: new line)"
            required></textarea>
  <div class="controls">
    <label>Max tokens <input id="max-tokens" type="number" min="1" max="@MAX_TOKENS@"
                             value="@DEFAULT_TOKENS@"></label>
    <label>Temperature <input id="temperature" type="number" min="0" step="0.1" value="0">
    </label>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
    <button id="clear" type="button">New chat</button>
  </div>
</form>
<script nonce="@NONCE@">
"use strict";
const MODEL = @MODEL_JSON@;
const transcript = document.getElementById("transcript");
const form = document.getElementById("composer");
const prompt = document.getElementById("prompt");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop");
const statusLine = document.getElementById("status");
const messages = [];  // the conversation sent with every request
let controller = null;

function setState(state, text) {
  document.body.dataset.state = state;
  statusLine.textContent = text;
  sendButton.disabled = state === "streaming";
  stopButton.disabled = state !== "streaming";
}

function addBubble(role, text) {
  const bubble = document.createElement("div");
  bubble.className = "message " + role;
  bubble.textContent = text;
  transcript.appendChild(bubble);
  transcript.scrollTop = transcript.scrollHeight;
  return bubble;
}

function numberInput(id, fallback) {
  const value = Number(document.getElementById(id).value);
  return Number.isFinite(value) ? value : fallback;
}

// Calls onData(payload) for every "data:" line of the server-sent event stream.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let boundary;
    while ((boundary = buffer.indexOf("\\n\\n")) >= 0) {
      const block = buffer.slice(0, boundary);
      buffer = buffer.slice(boundary + 2);
      for (const line of block.split("\\n")) {
        if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  }
}

async function send(text) {
  messages.push({ role: "user", content: text });
  addBubble("user", text);
  const bubble = addBubble("assistant", "");
  let reply = "";
  let chunks = 0;
  document.body.dataset.chunks = "0";
  setState("streaming", "generating\\u2026");
  controller = new AbortController();
  try {
    const headers = { "Content-Type": "application/json" };
    const key = sessionStorage.getItem("riftco-api-key");
    if (key) headers.Authorization = "Bearer " + key;
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers,
      body: JSON.stringify({
        model: MODEL, messages, stream: true,
        max_tokens: Math.max(1, Math.round(numberInput("max-tokens", 64))),
        temperature: Math.max(0, numberInput("temperature", 0)),
      }),
      signal: controller.signal,
    });
    if (response.status === 401) {
      const entered = window.prompt("This server needs its API key:");
      if (entered) sessionStorage.setItem("riftco-api-key", entered.trim());
    }
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new Error((body && body.error && body.error.message) || "HTTP " + response.status);
    }
    let finish = null;
    await readEvents(response, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      if (choice.delta && choice.delta.content) {
        reply += choice.delta.content;
        bubble.textContent = reply;
        chunks += 1;
        document.body.dataset.chunks = String(chunks);
        transcript.scrollTop = transcript.scrollHeight;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    });
    messages.push({ role: "assistant", content: reply });
    setState("idle", finish === "length" ? "stopped at the token limit" : "ready");
  } catch (error) {
    if (controller.signal.aborted) {
      messages.push({ role: "assistant", content: reply });
      setState("idle", "stopped");
    } else {
      messages.pop();  // the failed turn is not part of the conversation
      bubble.classList.add("error");
      bubble.textContent = reply + (reply ? "\\n" : "") + "[" + error.message + "]";
      setState("error", "error: " + error.message);
    }
  } finally {
    controller = null;
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = prompt.value.trim();
  if (!text || document.body.dataset.state === "streaming") return;
  prompt.value = "";
  send(text);
});
prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    form.requestSubmit();
  }
});
stopButton.addEventListener("click", () => { if (controller) controller.abort(); });
document.getElementById("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  messages.length = 0;
  transcript.replaceChildren();
  setState("idle", "ready");
});
prompt.focus();
document.body.dataset.ready = "true";
</script>
</body>
</html>
"""
