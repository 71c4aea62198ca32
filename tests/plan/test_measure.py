"""The measuring harness's command line for a planned run."""

from __future__ import annotations

import pytest

from leangnn.cli import _TRAIN_FLAGS, build_parser
from leangnn.config import TrainConfig
from leangnn.plan.measure import _cli_argv


@pytest.mark.parametrize("fields", [
    dict(strategy="reversible", model="gsr", conv="gcn", num_layers=4,
         num_groups=2, hidden_channels=8, dataset="iscas85/c17"),
    dict(strategy="auto", model="dag", hidden_channels=8, level_feature=True,
         reverse=False, rounds=2, aggr="attention", epochs=3),
    dict(strategy="offload", model="sage", flat_parameters=False, retain=False,
         num_parts=4, device_budget="64MiB", cache="none"),
    dict(strategy="full", model="dag", reverse=True, memory_budget=None),
    # sizes at another model's defaults (the DAG model's 2 layers and 32
    # channels are not SAGE's 8 and 64)
    dict(strategy="offload", model="sage", num_layers=2, hidden_channels=32,
         device_budget="16MiB", dataset="csbm:3000"),
    dict(strategy="reversible", model="gsr", num_layers=16, hidden_channels=32,
         epochs=40, task="critical"),
])
def test_cli_argv_sets_the_configuration_as_given(fields):
    # the command's own parser reads the options back into the same
    # configuration: every flag spelled as it spells it (--no-retain,
    # --level-feature, --layers), nothing at its default left to chance
    argv = _cli_argv(fields)
    args = build_parser().parse_args(["train", *argv])
    given = {field: getattr(args, dest) for dest, field in _TRAIN_FLAGS.items()
             if getattr(args, dest) is not None}
    assert TrainConfig(**given).to_dict() == TrainConfig(**fields).to_dict()
    assert "--model" in argv  # named even at its default
