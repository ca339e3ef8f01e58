"""Data-parallel training across processes and hosts, over MPI (launch with ``mpirun``).

The native library carries the MPI calls (build it with ``RIFTCO_TRANSFORMER_ENABLE_MPI=ON``,
the ``mpi`` CMake preset); this package stays dependency-free. Every rank holds a replica of
the model::

    group = ProcessGroup()                      # the world of `mpirun -n R python train.py`
    parallel = DataParallel(group)
    parallel.synchronize_parameters(model)      # same layout everywhere, rank 0's values
    ...                                          # each rank: its shard of every global batch
    loss.backward()
    parallel.reduce_gradients(model, local_weight=targets_counted)
    optimizer.step()                            # the same step on every rank

or, with the reduction running while backward still computes (bit-identical results)::

    parallel.backward_and_reduce(model, loss, local_weight=targets_counted)

``Adam(parameters, sharded_over=parallel)`` shards the optimizer's moments over the ranks
(ZeRO-1).

:class:`~riftco_transformer.training.CausalLanguageModelTrainer` does all of this when given
``data_parallel=``. Collectives have a deadline (``timeout`` seconds): when a rank died,
stopped or runs a different program, a rank whose collective passes its deadline prints which
one and exits (status 3), and ``mpirun`` ends the others: nothing hangs. :func:`compiled_in`
says whether this library links MPI; without it :class:`ProcessGroup` raises, and
``ProcessGroup.single()`` (a world of one) works anywhere.
"""

from __future__ import annotations

import ctypes
import math
import threading

from .native._errors import check_status
from .native._handle import NativeHandle
from .native._loader import library

DEFAULT_TIMEOUT_SECONDS = 120.0


def compiled_in() -> bool:
    """Whether the loaded native library was built with MPI."""
    value = ctypes.c_int32()
    check_status(library().rt_distributed_compiled_in(ctypes.byref(value)))
    return bool(value.value)


class ProcessGroup(NativeHandle):
    """The ranks of the current ``mpirun``/``mpiexec`` launch.

    ``timeout`` (seconds, > 0) bounds every collective. RiftcoTransformerError
    (runtime_error) when MPI is not compiled in or fails to start.
    """

    _release_function = "rt_process_group_release"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        pointer = ctypes.c_void_p()
        milliseconds = max(1, round(timeout * 1000))
        check_status(library().rt_process_group_create(milliseconds, ctypes.byref(pointer)))
        self._adopt(pointer.value, threading.RLock())

    @classmethod
    def single(cls) -> ProcessGroup:
        """A world of one process (rank 0); every collective is an identity."""
        pointer = ctypes.c_void_p()
        check_status(library().rt_process_group_create_single(ctypes.byref(pointer)))
        return cls._from_pointer(pointer.value, threading.RLock())

    @property
    def rank(self) -> int:
        return self._query("rt_process_group_rank", ctypes.c_int32)

    @property
    def world_size(self) -> int:
        return self._query("rt_process_group_world_size", ctypes.c_int32)

    def barrier(self) -> None:
        with self._native() as pointer:
            check_status(library().rt_process_group_barrier(pointer))

    def allreduce_sum(self, values) -> list[float]:
        """The elementwise sum over ranks of ``values`` (floats; same length everywhere)."""
        values = [float(value) for value in values]
        buffer = (ctypes.c_double * len(values))(*values)
        with self._native() as pointer:
            check_status(library().rt_process_group_allreduce_sum_f64(pointer, buffer, len(values)))
        return list(buffer)

    def broadcast_bytes(self, data: bytes | None, length: int, root: int = 0) -> bytes:
        """``root``'s ``length`` bytes on every rank (other ranks pass None or anything)."""
        buffer = (ctypes.c_uint8 * length)()
        if self.rank == root:
            if data is None or len(data) != length:
                raise ValueError(f"the root's data must be exactly {length} bytes")
            ctypes.memmove(buffer, data, length)
        with self._native() as pointer:
            check_status(library().rt_process_group_broadcast_bytes(pointer, buffer, length, root))
        return bytes(buffer)

    def broadcast_object_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """``root``'s bytes of any length on every rank (the length goes first)."""
        length = len(data) if self.rank == root and data is not None else 0
        length = int(self.allreduce_sum([length])[0])
        return self.broadcast_bytes(data, length, root)

    def allgather(self, value: int) -> list[int]:
        """Every rank's uint64 ``value``, in rank order."""
        size = self.world_size
        buffer = (ctypes.c_uint64 * size)()
        required = ctypes.c_uint64()
        with self._native() as pointer:
            check_status(library().rt_process_group_allgather_u64(
                pointer, value, buffer, size, ctypes.byref(required)))
        return list(buffer)

    @property
    def communication(self) -> tuple[int, float]:
        """(bytes, seconds) this group's data-parallel collectives moved and took so far."""
        count = ctypes.c_uint64()
        seconds = ctypes.c_double()
        with self._native() as pointer:
            check_status(library().rt_process_group_communication(
                pointer, ctypes.byref(count), ctypes.byref(seconds)))
        return count.value, seconds.value

    def __repr__(self) -> str:
        if self.closed:
            return "<ProcessGroup (closed)>"
        return f"<ProcessGroup rank {self.rank} of {self.world_size}>"


def _parameter_list(target):
    """A model's parameter list, or the list itself."""
    from .native.parameters import ParameterList

    if isinstance(target, ParameterList):
        return target, False
    parameters = getattr(target, "parameters", None)
    if not callable(parameters):
        raise TypeError(f"expected a model or a ParameterList, not {type(target).__name__}")
    return parameters(), True


class DataParallel:
    """Keeps model replicas identical across a :class:`ProcessGroup` (see the module)."""

    def __init__(self, group: ProcessGroup, bucket_bytes: int | None = None,
                 shard_optimizer: bool = False) -> None:
        """``shard_optimizer``: the trainer given this object replaces its optimizer by the
        same one sharded over the ranks (ZeRO-1: ``Adam(..., sharded_over=self)``)."""
        if not isinstance(group, ProcessGroup):
            raise TypeError(f"group must be a ProcessGroup, not {type(group).__name__}")
        if not isinstance(shard_optimizer, bool):
            raise TypeError("shard_optimizer must be a bool, not "
                            f"{type(shard_optimizer).__name__}")
        self.group = group
        self.shard_optimizer = shard_optimizer
        if bucket_bytes is not None:
            if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) \
                    or bucket_bytes < 4:
                raise ValueError(f"bucket_bytes must be an int >= 4, got {bucket_bytes!r}")
            with group._native() as pointer:
                check_status(library().rt_process_group_set_bucket_bytes(pointer, bucket_bytes))

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def _with_list(self, target, function: str, *arguments):
        parameters, owned = _parameter_list(target)
        try:
            with self.group._native() as group_pointer, parameters._native() as list_pointer:
                check_status(getattr(library(), function)(group_pointer, list_pointer, *arguments))
        finally:
            if owned:
                parameters.close()

    def synchronize_parameters(self, target) -> None:
        """Check every rank has the same parameter names and shapes (an error on every rank
        otherwise), then load rank 0's values everywhere. ``target``: a model (its base
        parameters) or a ParameterList (e.g. a LoRA adapter's)."""
        self._with_list(target, "rt_data_parallel_synchronize_parameters")

    def reduce_gradients(self, target, local_weight: float) -> float:
        """Replace each trainable gradient by the weighted average over ranks, weights
        ``local_weight`` (this rank's counted targets); returns the total weight."""
        if isinstance(local_weight, bool) or not isinstance(local_weight, (int, float)):
            raise TypeError(f"local_weight must be a number, not {type(local_weight).__name__}")
        total = ctypes.c_double()
        self._with_list(target, "rt_data_parallel_reduce_gradients", float(local_weight),
                        ctypes.byref(total))
        return total.value

    def backward_and_reduce(self, target, loss, local_weight: float, scale: float = 1.0,
                            accumulate: bool = False) -> float:
        """``loss.backward_scaled(scale, accumulate)`` then :meth:`reduce_gradients`, with
        the reduction overlapped with backward: each bucket of gradients starts its
        non-blocking allreduce as soon as backward has finished them. The same buckets and
        collectives, so the result is bit-identical. Consumes ``loss``'s graph; returns the
        total weight. C ABI 2.14."""
        from .native.autograd import Variable

        if not isinstance(loss, Variable):
            raise TypeError(f"loss must be a Variable, not {type(loss).__name__}")
        if isinstance(local_weight, bool) or not isinstance(local_weight, (int, float)):
            raise TypeError(f"local_weight must be a number, not {type(local_weight).__name__}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number, got {scale!r}")
        if not isinstance(accumulate, bool):
            raise TypeError(f"accumulate must be a bool, not {type(accumulate).__name__}")
        total = ctypes.c_double()
        parameters, owned = _parameter_list(target)
        try:
            with self.group._native() as group_pointer, parameters._native() as list_pointer, \
                    loss._native() as loss_pointer:
                check_status(library().rt_data_parallel_backward_and_reduce(
                    group_pointer, list_pointer, loss_pointer, float(local_weight), float(scale),
                    int(accumulate), ctypes.byref(total)))
        finally:
            if owned:
                parameters.close()
        return total.value

    def write_on_rank_zero(self, write, optimizer=None) -> None:
        """Rank 0 runs ``write()`` (a checkpoint: the replicas are identical) while the others
        wait until it is complete. With a sharded ``optimizer`` the others first take part in
        gathering its state, which ``write`` reads exactly once."""
        if self.rank == 0:
            write()
        elif optimizer is not None and getattr(optimizer, "sharded", False):
            optimizer.state()
        self.group.barrier()

    def shard(self, global_rows: int) -> tuple[int, int]:
        """Rows ``[begin, end)`` of a global batch this rank trains on."""
        size = self.world_size
        if isinstance(global_rows, bool) or not isinstance(global_rows, int) \
                or global_rows <= 0 or global_rows % size:
            raise ValueError(f"the global batch of {global_rows!r} rows is not a positive "
                             f"multiple of the world size {size}")
        rows = global_rows // size
        return self.rank * rows, (self.rank + 1) * rows

    def parameter_hash(self, target) -> int:
        """A 64-bit hash of the values (every replica must give the same)."""
        parameters, owned = _parameter_list(target)
        try:
            value = ctypes.c_uint64()
            with parameters._native() as pointer:
                check_status(library().rt_data_parallel_parameter_hash(pointer,
                                                                       ctypes.byref(value)))
            return value.value
        finally:
            if owned:
                parameters.close()

    def replicas_identical(self, target) -> bool:
        """Whether every rank's values hash the same (a collective)."""
        hashes = self.group.allgather(self.parameter_hash(target))
        return all(value == hashes[0] for value in hashes)


__all__ = ["DataParallel", "ProcessGroup", "compiled_in"]
