"""Atomic saves (``riftco_transformer._files``): the temporary files a killed writer leaves are
swept by the next save of the same destination, and a live writer's never are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import PYTHON_SOURCE

from riftco_transformer import _files
from riftco_transformer._files import atomic_write, atomic_write_bytes, sweep_temporary_files

pytestmark = pytest.mark.skipif(_files.fcntl is None, reason="temporary files are locked "
                                "and swept only where fcntl.flock exists")

TIMEOUT = 10.0

KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from riftco_transformer._files import atomic_write

    def write(stream):
        stream.write(b"x" * (1 << 20))
        stream.flush()
        print("writing", flush=True)
        time.sleep(60)

    atomic_write(sys.argv[1], write)
    """
)


def names(directory) -> set[str]:
    return {path.name for path in directory.iterdir()}


def test_a_save_killed_midway_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    path = tmp_path / "model.rift"
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    process = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)],
                               env=environment, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "writing\n"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(TIMEOUT)
        process.stdout.close()
    (leftover,) = names(tmp_path)
    assert leftover.startswith(f".model.rift.{process.pid}.") and leftover.endswith(".tmp")
    assert (tmp_path / leftover).stat().st_size == 1 << 20

    atomic_write_bytes(path, b"saved")
    assert names(tmp_path) == {"model.rift"}
    assert path.read_bytes() == b"saved"


def test_only_the_destinations_abandoned_temporary_files_are_swept(tmp_path):
    path = tmp_path / "model.rift"
    abandoned = [".model.rift.4242.abcdefgh.tmp", ".model.rift.1.zz_09xyz.tmp"]
    kept = [
        ".model.rift.abcdefgh.tmp",  # the older unlocked form: its writer cannot be known
        ".other.rift.4242.abcdefgh.tmp",  # another destination's
        ".model.rift.5.4242.abcdefgh.tmp",  # the destination model.rift.5's
        "model.rift.4242.abcdefgh.tmp",  # not hidden: not a temporary name
        ".model.rift.4242.abcdefgh.tmp.bak",
    ]
    for name in abandoned + kept:
        (tmp_path / name).write_bytes(b"partial")
    os.mkdir(tmp_path / ".model.rift.7.directory.tmp")  # not a regular file
    os.symlink(tmp_path / kept[0], tmp_path / ".model.rift.8.symlink.tmp")

    atomic_write_bytes(path, b"saved")
    assert names(tmp_path) == {"model.rift", *kept, ".model.rift.7.directory.tmp",
                               ".model.rift.8.symlink.tmp"}
    assert (tmp_path / kept[0]).read_bytes() == b"partial"  # the link's target too


def test_a_live_writers_temporary_file_is_never_swept(tmp_path):
    path = tmp_path / "model.rift"
    writing, release = threading.Event(), threading.Event()
    outcome = {}

    def slow_write(stream) -> None:
        stream.write(b"slow")
        writing.set()
        assert release.wait(TIMEOUT)

    def slow_save() -> None:
        try:
            outcome["path"] = atomic_write(path, slow_write)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = error

    writer = threading.Thread(target=slow_save)
    writer.start()
    try:
        assert writing.wait(TIMEOUT)
        (live,) = names(tmp_path)
        assert live.startswith(f".model.rift.{os.getpid()}.")
        # Another save (its own sweep first), then a sweep alone: both leave it.
        atomic_write_bytes(path, b"fast")
        assert sweep_temporary_files(path) == []
        assert names(tmp_path) == {"model.rift", live}
    finally:
        release.set()
        writer.join(TIMEOUT)
    assert outcome == {"path": path}
    assert path.read_bytes() == b"slow"
    assert names(tmp_path) == {"model.rift"}


def test_a_sweep_racing_a_writers_first_instant_costs_it_only_a_new_name(tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "model.rift"
    created = []
    real_mkstemp = _files.tempfile.mkstemp

    def mkstemp_then_sweep(**arguments):
        descriptor, temporary = real_mkstemp(**arguments)
        created.append(temporary)
        if len(created) == 1:  # a concurrent sweep sees the new file before it is locked
            assert sweep_temporary_files(path) == [path.parent / os.path.basename(temporary)]
        return descriptor, temporary

    monkeypatch.setattr(_files.tempfile, "mkstemp", mkstemp_then_sweep)
    atomic_write_bytes(path, b"saved")
    assert len(created) == 2
    assert path.read_bytes() == b"saved"
    assert names(tmp_path) == {"model.rift"}


def test_a_failed_save_removes_its_own_temporary_file(tmp_path):
    path = tmp_path / "model.rift"
    path.write_bytes(b"old")

    def failing(stream) -> None:
        stream.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, failing)
    assert names(tmp_path) == {"model.rift"}
    assert path.read_bytes() == b"old"
