"""Programmed models: a fixed program (a multilinear map) inside a small transformer.

``MultilinearMap`` imports the program (dense output-major values, or sparse flat indices
with values); ``ProgramAugmentedModel(config, program=None)`` builds the model, with an
optional ``ProgramBranch`` that lowers the map to a network (``NeuralLoweringConfig``) and
feeds it projected inputs from a source span. ``model.forward(tokens, options)`` returns
``(logits, trace)``: ``trace`` is a ``RepresentationTrace`` of detached copies when
``ProgramAugmentedForwardOptions(capture_representations=True)``, else None. Interventions
(batch rolls, steering, ablations) are part of the graph, so gradients still flow.
See ``include/riftco_transformer/programmed/program_augmented_model.hpp`` for the topology.
"""

from ._lowering import NeuralLoweringConfig
from ._model import (
    ProgramAugmentedForwardOptions,
    ProgramAugmentedModel,
    ProgramAugmentedModelConfig,
    ProgramBranch,
    ProgramInputLayout,
    ProgramSteering,
    Representation,
    RepresentationTrace,
)
from ._multilinear_map import MultilinearMap

__all__ = [
    "MultilinearMap",
    "NeuralLoweringConfig",
    "ProgramAugmentedForwardOptions",
    "ProgramAugmentedModel",
    "ProgramAugmentedModelConfig",
    "ProgramBranch",
    "ProgramInputLayout",
    "ProgramSteering",
    "Representation",
    "RepresentationTrace",
]
