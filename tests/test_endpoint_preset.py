"""presets/endpoint.yaml as a user runs it: against the local `transformers serve` of
tests/test_backends_openai.py, and refusing up front what an endpoint cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kbench.cli.main import main
from kbench.design import load_design
from kbench.methods import method_class
from kbench.methods.base import WEIGHT_HOOKS

from conftest import REPO
from test_backends_openai import KEY_ENV, api_key, server  # noqa: F401  (fixtures: the server and its key)

PRESET = REPO / "presets" / "endpoint.yaml"


def _preset(**changes) -> dict:
    """The preset as a dict, with `changes` ("section.key" -> value) applied."""
    data = yaml.safe_load(PRESET.read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        *sections, key = dotted.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return data


def _write(root: Path, data: dict) -> str:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def test_the_preset_is_an_endpoint_design_of_what_needs_no_weights():
    params = load_design(PRESET)
    assert (params.model.backend, params.model.base_url) == ("openai", "http://127.0.0.1:8000/v1")
    assert params.p_recipes == [] and not params.agent_base.enabled and "P" not in params.substrates
    assert all(not method_class(m).hooks & WEIGHT_HOOKS and not method_class(m).trains for m in params.methods)
    first = PRESET.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# ") and "endpoint" in first.lower()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"methods": ["none", "star", "eco"]}, "key 'methods': eco (forward hook)"),
        ({"methods": ["none", "o3"], "p_recipes": ["lora"]}, "key 'methods': o3 (forward hook)"),
        ({"p_recipes": ["lora", "merged"]}, "key 'p_recipes': recipe merged merges LoRA-T+D"),
        ({"agent_base.enabled": True}, "key 'agent_base.enabled'"),
    ],
)
def test_what_needs_weights_is_refused_when_params_load(kbench_root, capsys, change, named):
    params = _write(kbench_root, _preset(**change))
    for command in (["params"], ["corpus", "--no-track"]):  # validation, and the first stage
        assert main(["--params", params, *command]) == 2
        err = capsys.readouterr().err.strip()
        assert named in err and "the openai backend" in err
        assert "\n" not in err and "Traceback" not in err
    assert not (kbench_root / "artifacts").exists()


def test_a_server_that_applies_adapters_by_name_keeps_p_and_the_one_adapter_weight_methods():
    """vLLM serves LoRA adapters by name: P's recipe lora with none, gold and ga passes the check
    (whether the server serves them is asked when a cell starts, tests/test_served_adapters.py)."""
    from kbench.config import parse_params
    from kbench.design import check_design

    check_design(parse_params(_preset(**{"p_recipes": ["lora"], "methods": ["none", "gold", "ga", "star"]})))


@pytest.mark.parametrize(
    ("command", "stage", "change"),
    [
        (["inject", "--no-track"], "the inject stage", {}),
        (["probes", "--no-track"], "the probes stage", {}),
        (["unlearn", "--no-track"], "the unlearn stage", {"p_recipes": ["lora"], "methods": ["none", "ga"]}),
    ],
)
def test_stages_that_need_weights_refuse_an_endpoint_before_any_work(kbench_root, capsys, command, stage, change):
    assert main(["--params", _write(kbench_root, _preset(**change)), *command]) == 2
    err = capsys.readouterr().err.strip()
    assert stage in err and "run it on model.backend: hf" in err and "\n" not in err and "Traceback" not in err
    assert not (kbench_root / "artifacts").exists()


@pytest.mark.slow
def test_the_preset_runs_a_cell_against_a_served_model(server, kbench_root, capsys):  # noqa: F811
    """The preset pointed at the suite's server (its URL and served name, as docs/models.md
    says to), shrunk to one query per split and one ReAct step: the params check, the stages before the
    cells (agent-base, fit and unlearn have nothing to do on an endpoint), one cell."""
    params = _write(kbench_root, _preset(**{
        "model.base_url": server.base_url, "model.path": server.path, "model.api_key_env": KEY_ENV,
        "queries.n_per_split": 1, "queries.forms": [], "agent.max_iters": 1, "agent.max_new_tokens": 16,
        "agent.summary_max_new_tokens": 16,
    }))
    assert main(["--params", params, "params"]) == 0  # the server answers at model.base_url
    for stage in (["corpus", "--no-track"], ["index"], ["agent-base", "--no-track"], ["fit", "--no-track"],
                  ["unlearn", "--no-track"]):  # what `dvc repro cell` runs before the cells
        assert main(["--params", params, *stage]) == 0, stage
    capsys.readouterr()
    assert main(["--params", params, "cell", "--substrate", "R-struct", "--seed", "0", "--method", "none",
                 "--no-track", "--no-progress"]) == 0
    assert "cell " in capsys.readouterr().out
    cell = kbench_root / "artifacts" / "cells" / "R-struct__s0" / "none" / "none"
    records = [json.loads(line) for line in (cell / "traces.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["raw_reply"] for r in records)
    metrics = json.loads((cell / "metrics.json").read_text())
    assert {"forget", "retain"} <= metrics.keys()
