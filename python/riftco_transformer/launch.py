"""``riftco launch``: run a command on N ranks under Open MPI's ``mpirun``, and restart every
rank from the last checkpoint when one of them dies (torchrun's elastic restart, over MPI).

One attempt is ``mpirun -n N [mpirun arguments] <command>``. When it succeeds, so does the
launch. When it fails (a rank was killed, crashed or exited with an error; ``mpirun`` then
ends the others, and a stalled rank is ended by the others' collective deadline), the launcher
says why in one line, naming the rank and its signal or status as ``mpirun`` reported them,
and, while restarts are left (``max_restarts``), starts the whole command again. The command
must resume by itself: ``riftco pretrain`` and ``post-train`` do with ``--checkpoint PATH
--auto-resume`` (resume from PATH when it exists), so a restart continues from the last
checkpoint and ends with the artifact of an uninterrupted run. Every attempt's ranks see
``RIFTCO_LAUNCH_ATTEMPT`` (1, 2, ...) in their environment.

SIGINT or SIGTERM to the launcher is passed to ``mpirun`` (which passes it to the ranks) and
ends the launch without a restart. Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["LaunchResult", "failure_reason", "launch"]

# What Open MPI's mpirun prints about the process that ended the job.
_SIGNALLED = re.compile(r"rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"rank (\d+) with PID (\d+) on node (\S+) exited on status (\d+)")
_NONZERO = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(\d+)")


@dataclass(frozen=True)
class LaunchResult:
    """``status``: the last attempt's exit status (0: success); ``attempts`` made;
    ``failures``: one line per failed attempt, why it failed."""

    status: int
    attempts: int
    failures: tuple[str, ...]


def failure_reason(status: int, output: str) -> str:
    """Why an attempt failed, from ``mpirun``'s exit status and what it printed."""
    match = _SIGNALLED.search(output)
    if match:
        rank, pid, node, number = match.groups()
        try:
            name = signal.Signals(int(number)).name
        except ValueError:
            name = f"signal {number}"
        return f"rank {rank} (PID {pid} on {node}) was killed by {name} (signal {number})"
    match = _EXITED.search(output)
    if match:
        rank, pid, node, code = match.groups()
        return f"rank {rank} (PID {pid} on {node}) exited with status {code}"
    match = _NONZERO.search(output)
    if match:
        return f"rank {match.group(1)} exited with status {match.group(2)}"
    if status < 0:
        return f"mpirun was killed by signal {-status}"
    return f"mpirun exited with status {status}"


def _require(ranks: object, max_restarts: object, command: Sequence[str]) -> None:
    for name, value, low in (("ranks", ranks, 1), ("max_restarts", max_restarts, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not command or not all(isinstance(part, str) for part in command):
        raise ValueError("command must be a nonempty sequence of str (the program and its "
                         "arguments, after --)")


def launch(command: Sequence[str], ranks: int, max_restarts: int = 0,
           mpirun: str | None = None, mpirun_arguments: Sequence[str] = (),
           environment: dict[str, str] | None = None,
           say: Callable[[str], None] | None = None) -> LaunchResult:
    """Run ``command`` on ``ranks`` ranks, restarting up to ``max_restarts`` times; see the
    module docstring. ``mpirun`` defaults to $MPIEXEC or the ``mpirun`` on PATH
    (FileNotFoundError when there is none); ``say`` gets the one-line reports (stderr by
    default)."""
    _require(ranks, max_restarts, command)
    program = mpirun or os.environ.get("MPIEXEC") or shutil.which("mpirun")
    if not program:
        raise FileNotFoundError("no mpirun: install Open MPI (Debian: openmpi-bin) or name it "
                                "with --mpirun or $MPIEXEC")
    report = say or (lambda line: print(line, file=sys.stderr, flush=True))
    failures: list[str] = []
    attempt = 0
    while True:
        attempt += 1
        env = dict(os.environ if environment is None else environment)
        env["RIFTCO_LAUNCH_ATTEMPT"] = str(attempt)
        status, output, stopped = _attempt(
            [program, "-n", str(ranks), *mpirun_arguments, *command], env)
        if status == 0:
            return LaunchResult(0, attempt, tuple(failures))
        reason = failure_reason(status, output)
        failures.append(reason)
        if stopped is not None:
            report(f"riftco launch: stopped by {signal.Signals(stopped).name}; not restarting")
            return LaunchResult(status, attempt, tuple(failures))
        restarts_done = attempt - 1
        if restarts_done >= max_restarts:
            report(f"riftco launch: attempt {attempt} failed: {reason}; "
                   f"{'no restarts allowed' if max_restarts == 0 else 'no restarts left'} "
                   f"(--max-restarts {max_restarts})")
            return LaunchResult(status if status > 0 else 1, attempt, tuple(failures))
        report(f"riftco launch: attempt {attempt} failed: {reason}; restarting all {ranks} "
               f"ranks (restart {restarts_done + 1} of {max_restarts})")


def _attempt(arguments: list[str], env: dict[str, str]) -> tuple[int, str, int | None]:
    """One mpirun run: its status, what it printed on stderr (echoed as it comes), and the
    signal that stopped the launcher during it, if any (forwarded to mpirun)."""
    process = subprocess.Popen(arguments, env=env, stderr=subprocess.PIPE, text=True,
                               errors="replace")
    lines: list[str] = []

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def forward(signum, frame) -> None:
            stopped.append(signum)
            process.send_signal(signum)

        for number in (signal.SIGINT, signal.SIGTERM):
            previous[number] = signal.signal(number, forward)
    try:
        status = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    reader.join(timeout=10)
    return status, "".join(lines), stopped[0] if stopped else None
