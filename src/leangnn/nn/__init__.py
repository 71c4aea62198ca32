"""Neural network modules: GSR reversible stacks, sparse activations, models."""

from leangnn.nn.flat import FlatParameters
from leangnn.nn.group_sparse import GroupSparseAct, group_sparse_act
from leangnn.nn.models import (
    GSRGNN,
    MODELS,
    ModelEntry,
    ResGNN,
    build_model,
    get_model,
    model_arguments,
    register_model,
)
from leangnn.nn.reversible import CONVS, GSRBlock, GSRStack, build_conv

__all__ = [
    "FlatParameters",
    "GroupSparseAct",
    "group_sparse_act",
    "GSRBlock",
    "GSRStack",
    "GSRGNN",
    "ResGNN",
    "CONVS",
    "build_conv",
    "build_model",
    "MODELS",
    "ModelEntry",
    "register_model",
    "get_model",
    "model_arguments",
]
