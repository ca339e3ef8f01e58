"""ProgramAugmentedModel and its configuration, forward options and traces."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from functools import partial

from ..native._abi import (
    ProgramAugmentedModelConfigStruct,
    ProgramBranchConfigStruct,
    ProgramForwardOptionsStruct,
    ProgramInputLayoutStruct,
    ProgramSteeringStruct,
)
from ..native._buffers import read_sized, token_ids
from ..native._errors import check_status
from ..native._handle import NativeHandle
from ..native._loader import library
from ..native._validation import UINT32_LIMIT, UINT64_LIMIT, require_choice, require_int
from ..native.autograd import Variable
from ..native.backends import BACKEND_NAMES, backend_value
from ..native.model import ATTENTION_VALUES
from ..native.parameters import ParameterList
from ._lowering import NeuralLoweringConfig
from ._multilinear_map import MultilinearMap

SOURCES = {"whole_source": 0, "source_position": 1}
_SIZE_FIELDS = (
    "vocabulary_size",
    "context_length",
    "model_width",
    "head_count",
    "feed_forward_width",
    "attention_branch_count",
)


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class ProgramAugmentedModelConfig:
    """The model's shape (defaults are the ABI's): every forward takes exactly
    ``context_length`` positions; ``model_width`` must be a multiple of ``head_count``."""

    vocabulary_size: int = 512
    context_length: int = 128
    model_width: int = 64
    head_count: int = 4
    feed_forward_width: int = 256
    attention_branch_count: int = 2
    attention: str = "materialized"
    random_seed: int = 42

    def __post_init__(self) -> None:
        for name in _SIZE_FIELDS:
            require_int(getattr(self, name), name, 1, UINT64_LIMIT)
        require_choice(self.attention, "attention", ATTENTION_VALUES)
        require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)

    def _native(self) -> ProgramAugmentedModelConfigStruct:
        native = ProgramAugmentedModelConfigStruct()
        check_status(
            library().rt_program_augmented_model_config_init(
                ctypes.byref(native), ctypes.sizeof(native)
            )
        )
        for name in (*_SIZE_FIELDS, "random_seed"):
            setattr(native, name, getattr(self, name))
        native.attention = ATTENTION_VALUES[self.attention]
        return native


@dataclass(frozen=True)
class ProgramInputLayout:
    """Where one map argument comes from: ``"whole_source"`` (the source span flattened;
    ``position`` 0) or ``"source_position"`` (the span's row ``position``). Inputs with equal
    ``projection_group`` share one learned projection."""

    source: str = "whole_source"
    position: int = 0
    projection_group: int = 0

    def __post_init__(self) -> None:
        require_choice(self.source, "source", SOURCES)
        require_int(self.position, "position", 0, UINT64_LIMIT)
        require_int(self.projection_group, "projection_group", 0, UINT64_LIMIT)


@dataclass(frozen=True)
class ProgramBranch:
    """The program: ``map`` lowered by ``lowering``, fed from the source span
    ``[source_offset, +source_length)`` through one ``ProgramInputLayout`` per map argument,
    its output placed at ``[target_offset, +output_length)``."""

    map: MultilinearMap
    source_offset: int = 0
    source_length: int = 0
    target_offset: int = 0
    output_length: int = 1
    inputs: tuple[ProgramInputLayout, ...] = ()
    lowering: NeuralLoweringConfig = field(default_factory=NeuralLoweringConfig)
    input_projection_bias: bool = False
    merge_bias: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.map, MultilinearMap):
            raise TypeError(f"map must be a MultilinearMap, not {type(self.map).__name__}")
        for name in ("source_offset", "source_length", "target_offset", "output_length"):
            require_int(getattr(self, name), name, 0, UINT64_LIMIT)
        inputs = tuple(self.inputs)
        for layout in inputs:
            if not isinstance(layout, ProgramInputLayout):
                raise TypeError("inputs must hold ProgramInputLayout values")
        object.__setattr__(self, "inputs", inputs)
        if not isinstance(self.lowering, NeuralLoweringConfig):
            raise TypeError("lowering must be a NeuralLoweringConfig")
        _flag(self.input_projection_bias, "input_projection_bias")
        _flag(self.merge_bias, "merge_bias")


@dataclass(frozen=True)
class ProgramSteering:
    """An affine edit ``scales ⊙ v + offsets`` of program input ``input_index``'s row
    ``position`` (model_width values each, or empty)."""

    input_index: int
    position: int = 0
    scales: tuple[float, ...] = ()
    offsets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        require_int(self.input_index, "input_index", 0, UINT64_LIMIT)
        require_int(self.position, "position", 0, UINT64_LIMIT)
        object.__setattr__(self, "scales", tuple(float(v) for v in self.scales))
        object.__setattr__(self, "offsets", tuple(float(v) for v in self.offsets))


@dataclass(frozen=True)
class ProgramAugmentedForwardOptions:
    capture_representations: bool = False
    batch_roll_learned_attention: bool = False
    batch_roll_shift: int = 1
    steering: tuple[ProgramSteering, ...] = ()
    ablated_program_inputs: tuple[int, ...] = ()
    ablate_program_output: bool = False

    def __post_init__(self) -> None:
        _flag(self.capture_representations, "capture_representations")
        _flag(self.batch_roll_learned_attention, "batch_roll_learned_attention")
        _flag(self.ablate_program_output, "ablate_program_output")
        require_int(self.batch_roll_shift, "batch_roll_shift", 1, UINT64_LIMIT)
        steering = tuple(self.steering)
        for edit in steering:
            if not isinstance(edit, ProgramSteering):
                raise TypeError("steering must hold ProgramSteering values")
        object.__setattr__(self, "steering", steering)
        ablated = tuple(
            require_int(i, "ablated_program_inputs[i]", 0, UINT64_LIMIT)
            for i in self.ablated_program_inputs
        )
        object.__setattr__(self, "ablated_program_inputs", ablated)

    def _native(self):
        """The struct and the arrays it points to (keep all alive during the call)."""
        native = ProgramForwardOptionsStruct()
        check_status(
            library().rt_program_augmented_forward_options_init(
                ctypes.byref(native), ctypes.sizeof(native)
            )
        )
        native.capture_representations = int(self.capture_representations)
        native.batch_roll_learned_attention = int(self.batch_roll_learned_attention)
        native.batch_roll_shift = self.batch_roll_shift
        native.ablate_program_output = int(self.ablate_program_output)
        keep = []
        if self.steering:
            edits = (ProgramSteeringStruct * len(self.steering))()
            for edit, source in zip(edits, self.steering, strict=True):
                edit.input_index = source.input_index
                edit.position = source.position
                scales = (ctypes.c_float * len(source.scales))(*source.scales)
                offsets = (ctypes.c_float * len(source.offsets))(*source.offsets)
                keep += [scales, offsets]
                edit.scales = ctypes.cast(scales, ctypes.POINTER(ctypes.c_float))
                edit.scale_count = len(source.scales)
                edit.offsets = ctypes.cast(offsets, ctypes.POINTER(ctypes.c_float))
                edit.offset_count = len(source.offsets)
            keep.append(edits)
            native.steering = ctypes.cast(edits, ctypes.POINTER(ProgramSteeringStruct))
            native.steering_count = len(self.steering)
        if self.ablated_program_inputs:
            ablated = (ctypes.c_uint64 * len(self.ablated_program_inputs))(
                *self.ablated_program_inputs
            )
            keep.append(ablated)
            native.ablated_program_inputs = ctypes.cast(ablated, ctypes.POINTER(ctypes.c_uint64))
            native.ablated_program_input_count = len(self.ablated_program_inputs)
        return native, keep


@dataclass(frozen=True)
class Representation:
    name: str
    shape: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class RepresentationTrace:
    """Named internal representations of one forward, as owned Python tuples."""

    representations: tuple[Representation, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.representations)

    def __getitem__(self, name: str) -> Representation:
        for representation in self.representations:
            if representation.name == name:
                return representation
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.representations)

    def __len__(self) -> int:
        return len(self.representations)


def _read_trace(pointer: int) -> RepresentationTrace:
    native = library()
    count = ctypes.c_uint64()
    check_status(native.rt_representation_trace_count(pointer, ctypes.byref(count)))
    representations = []
    for index in range(count.value):
        name = read_sized(
            partial(native.rt_representation_trace_name, pointer, index), ctypes.c_char
        )
        shape = read_sized(
            partial(native.rt_representation_trace_shape, pointer, index), ctypes.c_uint64
        )
        values = read_sized(
            partial(native.rt_representation_trace_copy_f32, pointer, index), ctypes.c_float
        )
        representations.append(
            Representation(name.raw[:-1].decode("utf-8"), tuple(shape), tuple(values))
        )
    return RepresentationTrace(tuple(representations))


class ProgramAugmentedModel(NativeHandle):
    """A small transformer with an optional program branch (see the package docstring).

    Its parameter lists, variables and Adam optimizers share its lock and native state, as
    for DecoderOnlyTransformer.
    """

    _release_function = "rt_program_augmented_model_release"

    def __init__(self, config: ProgramAugmentedModelConfig, program: ProgramBranch | None = None):
        if not isinstance(config, ProgramAugmentedModelConfig):
            raise TypeError(
                f"config must be a ProgramAugmentedModelConfig, not {type(config).__name__}"
            )
        if program is not None and not isinstance(program, ProgramBranch):
            raise TypeError(
                f"program must be a ProgramBranch or None, not {type(program).__name__}"
            )
        native_config = config._native()
        pointer = ctypes.c_void_p()
        if program is None:
            check_status(
                library().rt_program_augmented_model_create(
                    ctypes.byref(native_config), None, None, None, ctypes.byref(pointer)
                )
            )
        else:
            branch = ProgramBranchConfigStruct()
            check_status(
                library().rt_program_branch_config_init(ctypes.byref(branch), ctypes.sizeof(branch))
            )
            branch.source_offset = program.source_offset
            branch.source_length = program.source_length
            branch.target_offset = program.target_offset
            branch.output_length = program.output_length
            layouts = (ProgramInputLayoutStruct * len(program.inputs))()
            for native_layout, layout in zip(layouts, program.inputs, strict=True):
                native_layout.source = SOURCES[layout.source]
                native_layout.position = layout.position
                native_layout.projection_group = layout.projection_group
            branch.inputs = ctypes.cast(layouts, ctypes.POINTER(ProgramInputLayoutStruct))
            branch.input_count = len(program.inputs)
            branch.input_projection_bias = int(program.input_projection_bias)
            branch.merge_bias = int(program.merge_bias)
            lowering = program.lowering._native()
            with program.map._native() as map_pointer:
                check_status(
                    library().rt_program_augmented_model_create(
                        ctypes.byref(native_config),
                        map_pointer,
                        ctypes.byref(branch),
                        ctypes.byref(lowering),
                        ctypes.byref(pointer),
                    )
                )
        self._adopt(pointer.value, threading.RLock())
        self._config = config

    @property
    def config(self) -> ProgramAugmentedModelConfig:
        with self._native():
            return self._config

    @property
    def has_program(self) -> bool:
        return bool(self._query("rt_program_augmented_model_has_program", ctypes.c_int32))

    @property
    def backend(self) -> str:
        return BACKEND_NAMES[self._query("rt_program_augmented_model_backend", ctypes.c_int32)]

    def to(self, backend) -> ProgramAugmentedModel:
        value = backend_value(backend, allow_auto=True)
        with self._native() as pointer:
            check_status(library().rt_program_augmented_model_to(pointer, value))
        return self

    def parameters(self) -> ParameterList:
        parameter_list = ctypes.c_void_p()
        with self._native() as pointer:
            check_status(
                library().rt_program_augmented_model_parameters(
                    pointer, ctypes.byref(parameter_list)
                )
            )
        return ParameterList._from_pointer(parameter_list.value, self._lock)

    def forward(
        self, tokens, options: ProgramAugmentedForwardOptions | None = None
    ) -> tuple[Variable, RepresentationTrace | None]:
        """``(logits [B, T, V], trace)`` for tokens ``[B, context_length]`` (a flat row is
        B = 1); ``trace`` is None unless ``options.capture_representations``."""
        if options is None:
            options = ProgramAugmentedForwardOptions()
        if not isinstance(options, ProgramAugmentedForwardOptions):
            raise TypeError("options must be ProgramAugmentedForwardOptions")
        ids = token_ids(tokens, "tokens")
        batch = 1 if len(ids.shape) == 1 else ids.shape[0]
        native_options, keep = options._native()
        logits = ctypes.c_void_p()
        trace = ctypes.c_void_p()
        native = library()
        with self._native() as pointer:
            check_status(
                native.rt_program_augmented_model_forward(
                    pointer,
                    ids.values,
                    len(ids.values),
                    batch,
                    ctypes.byref(native_options),
                    ctypes.byref(logits),
                    ctypes.byref(trace) if options.capture_representations else None,
                )
            )
            del keep
            result = Variable._from_pointer(logits.value, self._lock)
            if not options.capture_representations:
                return result, None
            try:
                return result, _read_trace(trace.value)
            finally:
                native.rt_representation_trace_release(trace.value)

    def __repr__(self) -> str:
        if self.closed:
            return "<ProgramAugmentedModel (closed)>"
        return f"<ProgramAugmentedModel {self._config} program={self.has_program}>"
