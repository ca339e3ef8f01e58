#!/usr/bin/env python3
"""Our OpenAI-compatible server against llama-server (issue 32's serving benchmark), in one run.

Both servers load the same GGUF file with the same thread count, the same context per slot
and as many parallel slots as there are concurrent streams (llama-server: ``-np N`` and
``-c N * slot context``, since it splits its context across slots; ours: a ModelService with
``max_active_requests=N`` and the model's context set to the slot context, started through
``serving.serve`` exactly as ``riftco serve`` does, because ``riftco serve`` has no flag for
``max_active_requests`` and would otherwise run at most 8 requests at once). Only one server
process runs at a time and each is timed in one block (all of one server, then all of the
other; ``--order``), never request by request in turn.

Every request goes through the OpenAI HTTP API with ``stream: true`` (to time first tokens),
greedy sampling set explicitly (``temperature`` 0, ``top_p`` 1, ``min_p`` 0, a fixed
``seed``) and a fixed ``max_tokens``. llama-server also gets ``ignore_eos: true`` and
``cache_prompt: true`` (its documented prompt cache; the default, set explicitly); ours has no
``ignore_eos``, so the prompts are story openings that a greedy decode continues past
``max_tokens``, and the script checks the token count of every timed request (the streamed
``usage``) and says when one ended early.

Measured, for each server:

* aggregate decode tokens/s at each ``--streams`` count: N streams start together (a
  barrier), each with its own short prompt; decode tokens/s is the sum over streams of
  (completion tokens - 1) over the time from the first stream's first token to the last
  stream's last token (the median of ``--repetitions`` runs); end-to-end tokens/s (all
  completion tokens over the whole run, prefill included) is printed beside it;
* time to first token: ``--ttft-requests`` single requests one after another on the 1-slot
  server, each with a new prompt of about ``--ttft-prompt-words`` words (nothing cached);
  the median;
* prefix caching: a chat whose system message has ``--system-sentences`` rules (about 1,000
  tokens); per
  repetition a new system message (cold: every prompt token is prefilled), then a second,
  different question on the same system message (warm); the medians and warm/cold;
* throughput under a competing busy process: the decode runs again while one
  ``python3 -c 'while True: pass'`` process (pinned nowhere) runs; the loss is
  1 - busy/quiet.

Our server weighs the GGUF as ``riftco serve`` loads it: dequantized to float32
(``--our-weights nf4`` packs it as NF4 first instead, which ``riftco serve`` does not do).
Beside every timing the script reports the cores the server, the client and the rest of the
machine used (/proc/stat), since other work on a shared machine moves these figures.

llama-server comes from llama.cpp's sources (e.g. the llama-cpp-python 0.3.36 sdist's
vendored copy), built outside the repository::

    cmake -S vendor/llama.cpp -B ~/.cache/riftco-transformer/llama-server-build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \\
        -DLLAMA_OPENSSL=OFF
    cmake --build ~/.cache/riftco-transformer/llama-server-build --target llama-server

Then (the library copied aside, so that a rebuild under way does not change it)::

    RIFTCO_TRANSFORMER_LIBRARY=/tmp/lib/libriftco_transformer_c.so \\
        python3 tools/bench_serving_vs_llama.py --threads 2 --json results.json

llama-server runs with ``--no-repack`` by default (``--llama-args``): built with GGML_NATIVE on
this Sapphire Rapids-class VM, its CPU backend compiles the AMX kernels, and its first Q4_1
matmul through the AMX buffer type dies at ``ldtilecfg`` (SIGSEGV/SIGILL in
``ggml_backend_amx_mul_mat``); ``--no-repack`` turns the CPU's extra buffer types off, and
for Q4_1 that is only AMX (ggml's repack has no Q4_1 layout), so it runs its AVX-512 Q4_1
kernels, the ones it would run on any machine without usable AMX.

It prints the machine, which build each side ran (llama-server's build line and
system_info; our library's path, version and ``cpu_info()``) and a table of ours, theirs
and ours/theirs. This is a report, not a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path.home() / ".cache" / "riftco-transformer"
DEFAULT_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_LLAMA_SERVER = CACHE / "llama-server-build" / "bin" / "llama-server"
REPOSITORY = Path(__file__).resolve().parent.parent

WORDS = ("river", "lantern", "orchard", "granite", "meadow", "harbor", "violet", "copper",
         "thistle", "canyon", "ember", "willow", "quartz", "falcon", "saffron", "glacier")
QUESTIONS = ("Which rule mentions the falcon?", "Summarise the rules about the harbor.",
             "What should I say about copper?", "Name three rules about the meadow.",
             "Which rule is the first one?", "What do the rules say about glaciers?",
             "Is there a rule about willows?", "List the rules that mention quartz.")

# Our server, started as `riftco serve` starts it (cli.command_serve), with the slot count
# and context as arguments: path, port, max_active_requests, maximum_context.
OUR_LAUNCHER = """
import sys
from pathlib import Path
from riftco_transformer.native import cpu_info
from riftco_transformer.pretrained import load_pretrained
from riftco_transformer.serving import ModelService, ServingConfig, serve
path, port, slots, context = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4])
weights = sys.argv[5]
config = ServingConfig(port=port, maximum_new_tokens=None, model_name=path.stem,
                       max_active_requests=slots, max_connections=max(128, 4 * slots))
with load_pretrained(path, maximum_context=context) as loaded:
    if weights == "nf4":  # not what riftco serve does: --our-weights nf4
        loaded.model.untie_embeddings()
        loaded.model.quantize_nf4(block_size=64)
    with ModelService(loaded.model, loaded.tokenizer, config,
                      chat_template=loaded.chat_template) as service:
        print("cpu_info:", cpu_info(), flush=True)
        print("engine:", service.engine.kind, "prefix_caching:",
              getattr(service.engine, "prefix_caching", None), "weights:", weights, flush=True)
        print("health:", service.health(), flush=True)
        serve(service, ready=lambda server: print("ready", server.url, flush=True))
"""


# ---- HTTP -------------------------------------------------------------------------------------


@dataclass
class StreamResult:
    """One streamed request: when it was sent, its first and last token, and its counts."""

    sent: float = 0.0
    first: float | None = None
    last: float | None = None
    events: int = 0  # chunks carrying text
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    timings: dict = field(default_factory=dict)  # llama-server's own timings, when sent
    error: str | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.events

    @property
    def ttft(self) -> float:
        return self.first - self.sent


def stream_request(port: int, route: str, body: dict, result: StreamResult,
                   timeout: float = 600.0) -> StreamResult:
    """POSTs ``body`` to ``route`` with stream=true and reads the server-sent events."""
    data = json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        result.sent = time.perf_counter()
        connection.request("POST", route, body=data,
                           headers={"Content-Type": "application/json",
                                    "Accept": "text/event-stream"})
        response = connection.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:300]!r}"
            return result
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(payload)
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta")
                piece = (delta or {}).get("content") if delta is not None else choice.get("text")
                if piece:
                    result.events += 1
                    result.text += piece
                    if result.first is None:
                        result.first = now
                    result.last = now
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                result.completion_tokens = usage.get("completion_tokens")
                result.prompt_tokens = usage.get("prompt_tokens")
            if chunk.get("timings"):
                result.timings = chunk["timings"]
    except (OSError, http.client.HTTPException, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    if result.error is None and result.first is None:
        result.error = "no token was streamed"
    return result


def get_json(port: int, route: str, timeout: float = 5.0) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", route)
        response = connection.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data
    finally:
        connection.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- servers ----------------------------------------------------------------------------------


class Server:
    """One server process (ours or llama-server), its log, and its request bodies."""

    name = ""

    def __init__(self, arguments, slots: int) -> None:
        self.arguments = arguments
        self.slots = slots
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{self.name}-",
                                               suffix=".log", delete=False)
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict:
        environment = dict(os.environ)
        environment["OMP_NUM_THREADS"] = str(self.arguments.threads)
        return environment

    def extra(self) -> dict:
        """Fields only this server gets (its way of asking for the same behaviour)."""
        return {}

    def __enter__(self) -> Server:
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        env=self.environment(), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n"
                                   + self.log_text()[-3000:])
            try:
                status, _ = get_json(self.port, "/health", timeout=2.0)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become healthy:\n" + self.log_text()[-3000:])

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def body(self, base: dict) -> dict:
        return {**base, **self.extra()}

    def describe(self) -> str:
        return " ".join(shlex.quote(part) for part in self.command())


class OurServer(Server):
    name = "ours"

    def command(self) -> list[str]:
        return [sys.executable, "-c", OUR_LAUNCHER, str(self.arguments.model), str(self.port),
                str(self.slots), str(self.arguments.slot_context), self.arguments.our_weights]

    def describe(self) -> str:
        return (f"python3 -c <riftco serve with max_active_requests={self.slots}, "
                f"maximum_context={self.arguments.slot_context}, weights "
                f"{self.arguments.our_weights}> {self.arguments.model}")

    def environment(self) -> dict:
        environment = super().environment()
        environment["RIFTCO_TRANSFORMER_NUM_THREADS"] = str(self.arguments.threads)
        environment["RIFTCO_TRANSFORMER_LIBRARY"] = str(self.arguments.library)
        python = str(self.arguments.python_path)
        old = environment.get("PYTHONPATH")
        environment["PYTHONPATH"] = python if not old else python + os.pathsep + old
        return environment


class LlamaServer(Server):
    name = "llama-server"

    def command(self) -> list[str]:
        threads = str(self.arguments.threads)
        return [str(self.arguments.llama_server), "-m", str(self.arguments.model),
                "-t", threads, "-tb", threads, "-np", str(self.slots),
                "-c", str(self.slots * self.arguments.slot_context),
                "--host", "127.0.0.1", "--port", str(self.port), "--no-webui",
                *shlex.split(self.arguments.llama_args)]

    def extra(self) -> dict:
        return {"ignore_eos": True, "cache_prompt": True}


# ---- workloads --------------------------------------------------------------------------------


def sampling(max_tokens: int) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "min_p": 0.0,
            "seed": 1234, "stream": True, "stream_options": {"include_usage": True}}


def story_prompt(tag: str, index: int) -> str:
    first, second = WORDS[index % len(WORDS)], WORDS[(index * 7 + 3) % len(WORDS)]
    return (f"Chapter {tag}-{index}. The long history of the {first} town by the {second} "
            f"valley begins many centuries ago, when the first settlers arrived")


def long_prompt(tag: str, index: int, words: int) -> str:
    parts = [story_prompt(tag, index) + "."]
    count = len(parts[0].split())
    step = index * 13
    while count < words:
        sentence = (f"In year {step} the people of the {WORDS[step % len(WORDS)]} quarter "
                    f"traded {WORDS[(step * 5 + 1) % len(WORDS)]} for "
                    f"{WORDS[(step * 11 + 2) % len(WORDS)]}.")
        parts.append(sentence)
        count += len(sentence.split())
        step += 1
    return " ".join(parts) + " Then"


def system_text(tag: str, sentences: int) -> str:
    """A policy-like system message, different per ``tag`` from its first words on."""
    rules = []
    for index in range(sentences):
        word = WORDS[(index + len(tag)) % len(WORDS)]
        other = WORDS[(index * 31 + 5) % len(WORDS)]
        rules.append(f"Rule {index}: when asked about the {word}, mention the {other}.")
    return f"{tag}. You are a careful assistant. " + " ".join(rules)


def run_streams(server: Server, count: int, tag: str, max_tokens: int) -> dict:
    """``count`` concurrent completions started together; their aggregate rates."""
    results = [StreamResult() for _ in range(count)]
    barrier = threading.Barrier(count + 1)

    def worker(index: int) -> None:
        body = server.body({"prompt": story_prompt(tag, index), **sampling(max_tokens)})
        barrier.wait()
        stream_request(server.port, "/v1/completions", body, results[index])

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    end = time.perf_counter()
    errors = [result.error for result in results if result.error]
    if errors:
        raise RuntimeError(f"{server.name}: {errors[0]}")
    first = min(result.first for result in results)
    last = max(result.last for result in results)
    decode_tokens = sum(result.tokens - 1 for result in results)
    short = [result.tokens for result in results if result.tokens != max_tokens]
    server_rates = [result.timings.get("predicted_per_second") for result in results
                    if result.timings.get("predicted_per_second")]
    return {
        "decode_tps": decode_tokens / (last - first),
        "end_to_end_tps": sum(result.tokens for result in results) / (end - start),
        "ttft_median": statistics.median(result.ttft for result in results),
        "short": short,
        "tokens": [result.tokens for result in results],
        "events": [result.events for result in results],
        "server_rates": server_rates,
        "texts": [result.text for result in results],
    }


class CpuAccount:
    """The CPU time the rest of the machine used while a measurement ran, in cores: all busy
    time (/proc/stat) less the server's and this process's own (a busy process counts as the
    rest of the machine)."""

    TICKS = os.sysconf("SC_CLK_TCK")

    def __init__(self, server: Server) -> None:
        self.pid = server.process.pid

    @staticmethod
    def machine_ticks() -> tuple[int, int]:
        """Busy ticks (less idle, iowait and steal) and steal ticks (the hypervisor's)."""
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0]
                  .split()[1:9]]
        return sum(fields) - fields[3] - fields[4] - fields[7], fields[7]

    def server_ticks(self) -> int:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime

    @staticmethod
    def own_ticks() -> float:
        times = os.times()
        return (times.user + times.system) * CpuAccount.TICKS

    def __enter__(self) -> CpuAccount:
        self.wall = time.perf_counter()
        self.busy, self.steal = self.machine_ticks()
        self.server, self.own = self.server_ticks(), self.own_ticks()
        return self

    def __exit__(self, *exc) -> None:
        ticks = (time.perf_counter() - self.wall) * self.TICKS
        busy, steal = self.machine_ticks()
        self.steal_cores = (steal - self.steal) / ticks
        self.server_cores = (self.server_ticks() - self.server) / ticks
        self.client_cores = (self.own_ticks() - self.own) / ticks
        self.other_cores = max(0.0, (busy - self.busy) / ticks - self.server_cores
                               - self.client_cores)


def measure_streams(server: Server, count: int, label: str, arguments) -> dict:
    with CpuAccount(server) as account:
        runs = [run_streams(server, count, f"{label}{repetition}", arguments.max_tokens)
                for repetition in range(arguments.repetitions)]
    short = [tokens for run in runs for tokens in run["short"]]
    summary = {
        "decode_tps": statistics.median(run["decode_tps"] for run in runs),
        "decode_tps_runs": [round(run["decode_tps"], 1) for run in runs],
        "end_to_end_tps": statistics.median(run["end_to_end_tps"] for run in runs),
        "ttft_median": statistics.median(run["ttft_median"] for run in runs),
        "short": short,
        "events_per_token": (sum(sum(run["events"]) for run in runs)
                             / max(1, sum(sum(run["tokens"]) for run in runs))),
        "first_text": runs[0]["texts"][0],
        "server_cores": account.server_cores,
        "client_cores": account.client_cores,
        "other_cores": account.other_cores,
        "steal_cores": account.steal_cores,
    }
    rates = [rate for run in runs for rate in run["server_rates"]]
    if rates:
        summary["server_reported_stream_tps"] = statistics.median(rates)
    return summary


def measure_ttft(server: Server, arguments) -> dict:
    values, prompt_tokens = [], []
    for index in range(arguments.ttft_requests):
        body = server.body({"prompt": long_prompt("ttft", index, arguments.ttft_prompt_words),
                            **sampling(4)})
        result = stream_request(server.port, "/v1/completions", body, StreamResult())
        if result.error:
            raise RuntimeError(f"{server.name}: {result.error}")
        values.append(result.ttft)
        prompt_tokens.append(result.prompt_tokens)
    return {"median": statistics.median(values), "values": values,
            "prompt_tokens": prompt_tokens}


def measure_prefix(server: Server, arguments) -> dict:
    cold, warm, prompt_tokens, server_prompt_ms = [], [], [], {"cold": [], "warm": []}
    for repetition in range(arguments.prefix_repetitions):
        system = system_text(f"Assistant {repetition} of house {os.getpid()}",
                             arguments.system_sentences)
        for phase, question in (("cold", QUESTIONS[(2 * repetition) % len(QUESTIONS)]),
                                ("warm", QUESTIONS[(2 * repetition + 1) % len(QUESTIONS)])):
            body = server.body({"messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": question}],
                                **sampling(8)})
            result = stream_request(server.port, "/v1/chat/completions", body, StreamResult())
            if result.error:
                raise RuntimeError(f"{server.name}: {result.error}")
            (cold if phase == "cold" else warm).append(result.ttft)
            if phase == "cold":
                prompt_tokens.append(result.prompt_tokens)
            if result.timings.get("prompt_ms") is not None:
                server_prompt_ms[phase].append((result.timings["prompt_n"],
                                                round(result.timings["prompt_ms"], 1)))
    summary = {"cold": statistics.median(cold), "warm": statistics.median(warm),
               "cold_values": cold, "warm_values": warm, "prompt_tokens": prompt_tokens}
    summary["ratio"] = summary["warm"] / summary["cold"]
    if server_prompt_ms["cold"]:
        summary["server_prompt_n_ms"] = server_prompt_ms
    return summary


class BusyProcess:
    """One Python busy loop, pinned nowhere."""

    def __enter__(self) -> BusyProcess:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                        stdin=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait()


def warm_up(server: Server) -> None:
    body = server.body({"prompt": story_prompt("warmup", 0), **sampling(8)})
    result = stream_request(server.port, "/v1/completions", body, StreamResult())
    if result.error:
        raise RuntimeError(f"{server.name}: warm-up failed: {result.error}")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def llama_system_info(arguments) -> list[str]:
    """llama-server's system_info line (logged at -lv 4 only), from a start that is not timed
    (the timed servers run at the default verbosity)."""
    probe = argparse.Namespace(**vars(arguments))
    probe.llama_args = arguments.llama_args + " -lv 4"
    with LlamaServer(probe, 1) as server:
        log = server.log_text()
    return [line.split(": ", 1)[-1].strip() for line in log.splitlines()
            if "system_info" in line]


def bench_server(kind, arguments) -> dict:
    """Every measurement of one server, in one block."""
    results: dict = {"streams": {}, "busy": {}, "load": [load_average()]}
    if kind is LlamaServer:
        results["system_info"] = llama_system_info(arguments)
    for count in arguments.streams:
        with kind(arguments, count) as server:
            warm_up(server)
            print(f"  {server.name}: {count} stream(s), load {load_average()}", flush=True)
            results["streams"][count] = measure_streams(server, count, f"q{count}-", arguments)
            if count in arguments.busy_streams:
                with BusyProcess():
                    results["busy"][count] = measure_streams(server, count, f"b{count}-",
                                                             arguments)
            if count == 1:
                print(f"  {server.name}: time to first token, prefix cache", flush=True)
                with CpuAccount(server) as account:
                    results["ttft"] = measure_ttft(server, arguments)
                    results["prefix"] = measure_prefix(server, arguments)
                results["ttft"]["other_cores"] = account.other_cores
            results.setdefault("log", server.log_text())
            results.setdefault("commands", []).append(server.describe())
            results["last_log"] = server.log_text()
    results["load"].append(load_average())
    return results


# ---- report -----------------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                   check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    flags = Path("/proc/cpuinfo").read_text().split()
    isa = [name for name in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
           if name in flags]
    return f"{model}; {os.cpu_count()} logical CPUs; {', '.join(isa) or 'no AVX2'}"


def llama_build_info(arguments) -> list[str]:
    lines = []
    version = subprocess.run([str(arguments.llama_server), "--version"], capture_output=True,
                             text=True, check=False)
    lines += [line for line in (version.stdout + version.stderr).splitlines() if line.strip()]
    return lines


def our_build_info(arguments, log: str) -> list[str]:
    library = Path(arguments.library)
    lines = [f"library {library} -> {library.resolve()}",
             f"python package {arguments.python_path}"]
    head = subprocess.run(["git", "-C", str(arguments.python_path), "rev-parse", "--short",
                           "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    if head:  # a package outside a git checkout (a snapshot) has none
        lines.append(f"python package's checkout at {head}")
    lines += [line.strip() for line in log.splitlines()
              if line.startswith(("cpu_info:", "engine:", "health:"))]
    return lines


def cores(entry: dict) -> str:
    return (f"cores used: server {entry['server_cores']:.2f}, client "
            f"{entry['client_cores']:.2f}, rest of the machine {entry['other_cores']:.2f}, "
            f"hypervisor steal {entry['steal_cores']:.2f}")


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def report(arguments, ours: dict, theirs: dict) -> None:
    print()
    print(f"machine: {machine()}")
    print(f"model: {arguments.model}; threads {arguments.threads}; slot context "
          f"{arguments.slot_context}; max_tokens {arguments.max_tokens}; "
          f"repetitions {arguments.repetitions}; order {arguments.order}")
    print("ours:")
    for line in our_build_info(arguments, ours["log"]) + ours["commands"]:
        print(f"  {line}")
    print(f"  environment OMP_NUM_THREADS={arguments.threads} "
          f"RIFTCO_TRANSFORMER_NUM_THREADS={arguments.threads}")
    print("llama-server:")
    for line in (llama_build_info(arguments) + theirs["system_info"]
                 + theirs["commands"]):
        print(f"  {line}")
    print(f"load average (1/5/15 min) before/after: ours {' | '.join(ours['load'])}; "
          f"llama-server {' | '.join(theirs['load'])}")
    print()
    rows = [("item", "ours", "llama-server", "ours/theirs", "target")]
    for count in arguments.streams:
        mine, other = ours["streams"][count], theirs["streams"][count]
        rows.append((f"decode tok/s, {count} stream(s)", f"{mine['decode_tps']:.1f}",
                     f"{other['decode_tps']:.1f}",
                     ratio(mine["decode_tps"], other["decode_tps"]), ">= 1.0x"))
        rows.append((f"  end-to-end tok/s, {count}", f"{mine['end_to_end_tps']:.1f}",
                     f"{other['end_to_end_tps']:.1f}",
                     ratio(mine["end_to_end_tps"], other["end_to_end_tps"]), ""))
        rows.append((f"  median TTFT ms, {count} concurrent", f"{mine['ttft_median'] * 1e3:.0f}",
                     f"{other['ttft_median'] * 1e3:.0f}",
                     ratio(mine["ttft_median"], other["ttft_median"]), ""))
    mine, other = ours["ttft"], theirs["ttft"]
    rows.append((f"median TTFT ms, 1 request (~{mine['prompt_tokens'][0]}/"
                 f"{other['prompt_tokens'][0]} prompt tokens)", f"{mine['median'] * 1e3:.0f}",
                 f"{other['median'] * 1e3:.0f}", ratio(mine["median"], other["median"]),
                 "<= 1.0x"))
    mine, other = ours["prefix"], theirs["prefix"]
    rows.append((f"system prompt ({mine['prompt_tokens'][0]}/{other['prompt_tokens'][0]} "
                 "tokens): cold TTFT ms", f"{mine['cold'] * 1e3:.0f}",
                 f"{other['cold'] * 1e3:.0f}", ratio(mine["cold"], other["cold"]), ""))
    rows.append(("  warm TTFT ms", f"{mine['warm'] * 1e3:.0f}", f"{other['warm'] * 1e3:.0f}",
                 ratio(mine["warm"], other["warm"]), ""))
    rows.append(("  warm/cold", f"{mine['ratio']:.3f}", f"{other['ratio']:.3f}",
                 ratio(mine["ratio"], other["ratio"]), "ours <= 0.2"))
    for count in arguments.busy_streams:
        quiet_mine, quiet_other = ours["streams"][count], theirs["streams"][count]
        busy_mine, busy_other = ours["busy"][count], theirs["busy"][count]
        loss_mine = 1 - busy_mine["decode_tps"] / quiet_mine["decode_tps"]
        loss_other = 1 - busy_other["decode_tps"] / quiet_other["decode_tps"]
        rows.append((f"busy process, {count} stream(s): decode tok/s",
                     f"{busy_mine['decode_tps']:.1f}", f"{busy_other['decode_tps']:.1f}",
                     ratio(busy_mine["decode_tps"], busy_other["decode_tps"]), ""))
        rows.append(("  throughput loss", f"{loss_mine:.1%}", f"{loss_other:.1%}",
                     f"{(loss_mine - loss_other) * 100:+.1f} pt", "ours <= theirs"))
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                        for column, (cell, width) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print()
    print("details:")
    for name, side in (("ours", ours), ("llama-server", theirs)):
        for count in arguments.streams:
            entry = side["streams"][count]
            extra = ""
            if "server_reported_stream_tps" in entry:
                extra = (f"; server-reported per-stream tok/s "
                         f"{entry['server_reported_stream_tps']:.1f}")
            print(f"  {name} {count} stream(s): decode runs {entry['decode_tps_runs']}, "
                  f"SSE text chunks per token {entry['events_per_token']:.2f}{extra}; "
                  f"{cores(entry)}")
            if entry["short"]:
                print(f"  WARNING {name} {count} stream(s): requests ended before max_tokens "
                      f"with {entry['short']} tokens")
        for count, entry in side["busy"].items():
            print(f"  {name} busy {count} stream(s): decode runs {entry['decode_tps_runs']}; "
                  f"{cores(entry)}")
            if entry["short"]:
                print(f"  WARNING {name} busy {count}: short requests {entry['short']}")
        print(f"  {name} TTFT ms: {[round(value * 1e3) for value in side['ttft']['values']]}; "
              f"the rest of the machine used {side['ttft']['other_cores']:.2f} cores during "
              "the TTFT and prefix phases")
        prefix = side["prefix"]
        print(f"  {name} prefix cold ms {[round(value * 1e3) for value in prefix['cold_values']]}"
              f", warm ms {[round(value * 1e3) for value in prefix['warm_values']]}")
        if "server_prompt_n_ms" in prefix:
            print(f"  {name} server-reported (prompt_n, prompt_ms): "
                  f"{prefix['server_prompt_n_ms']}")
    mine = ours["streams"][arguments.streams[0]]["first_text"]
    other = theirs["streams"][arguments.streams[0]]["first_text"]
    common = os.path.commonprefix([mine, other])
    print(f"  the first stream's greedy text: {len(common)} characters alike of {len(mine)} "
          f"(ours) and {len(other)} (llama-server); ours {mine[:160]!r}; "
          f"llama-server {other[:160]!r}")


def parse_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--library", type=Path,
                        default=Path(os.environ.get(
                            "RIFTCO_TRANSFORMER_LIBRARY",
                            REPOSITORY / "build" / "release" / "libriftco_transformer_c.so")))
    parser.add_argument("--python-path", type=Path, default=REPOSITORY / "python")
    parser.add_argument("--our-weights", choices=("f32", "nf4"), default="f32",
                        help="f32: the GGUF dequantized to float32, as riftco serve loads it; "
                        "nf4: untie_embeddings() then quantize_nf4(block_size=64) first (not "
                        "what riftco serve does)")
    parser.add_argument("--llama-args", default="--no-repack",
                        help="more llama-server arguments (default --no-repack: see above)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=parse_list, default=[1, 4, 8, 16])
    parser.add_argument("--busy-streams", type=parse_list, default=None,
                        help="stream counts also timed beside a busy process (default: all)")
    parser.add_argument("--slot-context", type=int, default=2048,
                        help="context per slot (llama-server: -c slots * this)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--ttft-requests", type=int, default=8)
    parser.add_argument("--ttft-prompt-words", type=int, default=100)
    parser.add_argument("--prefix-repetitions", type=int, default=4)
    parser.add_argument("--system-sentences", type=int, default=64,
                        help="rules in the system message (64: about 1,000 tokens on SmolLM2)")
    parser.add_argument("--order", choices=("ours-first", "theirs-first"), default="ours-first")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    arguments = parser.parse_args()
    if arguments.busy_streams is None:
        arguments.busy_streams = list(arguments.streams)
    if 1 not in arguments.streams:
        parser.error("--streams must include 1 (time to first token and prefix caching run "
                     "on the 1-slot servers)")
    for path, what in ((arguments.model, "--model"), (arguments.llama_server, "--llama-server"),
                       (arguments.library, "--library")):
        if not path.exists():
            parser.error(f"{what} {path} does not exist")
    arguments.busy_streams = [count for count in arguments.busy_streams
                              if count in arguments.streams]

    kinds = [OurServer, LlamaServer]
    if arguments.order == "theirs-first":
        kinds.reverse()
    results = {}
    for kind in kinds:
        print(f"{kind.name}: block start, load {load_average()}", flush=True)
        results[kind.name] = bench_server(kind, arguments)
    report(arguments, results["ours"], results["llama-server"])
    if arguments.json is not None:
        clean = {name: {key: value for key, value in side.items()
                        if key not in ("log", "last_log")} for name, side in results.items()}
        arguments.json.write_text(json.dumps(clean, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
