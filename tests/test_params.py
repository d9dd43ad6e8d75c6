from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from pydantic import BaseModel
from dvc.utils.serialize import modify_yaml

from kbench.cli.main import main
from kbench.config import ParamsError, load_params, parse_params
from kbench.design import check_design, design_digest, load_design

from conftest import REPO


def _keys(data, prefix=""):
    keys = set()
    for key, value in data.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _keys(value, prefix + key + ".")
    return keys


def _fields(value):
    """Every field of a params model as nested dicts (a dump leaves some out at their defaults)."""
    if isinstance(value, BaseModel):
        return {name: _fields(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {key: _fields(v) for key, v in value.items()}
    return value


@pytest.mark.parametrize("name", ["params.yaml", "presets/cpu.yaml", "presets/cpu-full.yaml", "presets/paper.yaml",
                                  "presets/cpu-gemma.yaml", "presets/cpu-full-gemma.yaml"])
def test_shipped_params_are_valid(name):
    load_design(REPO / name)  # the schema, the registries and every method's section


def _method_keys(keys):
    return {key for key in keys if key.startswith("method_params.")}


@pytest.mark.parametrize("name", ["params.yaml", "presets/cpu-full.yaml"])
def test_a_params_file_rewritten_by_dvc_exp_run_set_param_is_the_same_design(tmp_path, name):
    """`dvc exp run -S key=value` rewrites params.yaml (YAML 1.2, quotes dropped: "no" -> no);
    every other key still reads as it did."""
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / name, path)
    with modify_yaml(path) as data:
        data["seeds"] = [0, 1, 2]
    assert re.search(r"mixed_precision: no\b", path.read_text())  # what made YAML 1.1 read false
    changed = load_design(path)
    assert changed.seeds == [0, 1, 2]
    assert changed.model_copy(update={"seeds": load_design(REPO / name).seeds}) == load_design(REPO / name)


def test_presets_set_every_key_and_the_same_keys():
    cpu = yaml.safe_load((REPO / "presets/cpu.yaml").read_text())
    paper = yaml.safe_load((REPO / "presets/paper.yaml").read_text())
    # The same keys, but for the methods' sections, where a preset states only what it changes.
    assert _keys(cpu) - _method_keys(_keys(cpu)) == _keys(paper) - _method_keys(_keys(paper))
    # Every schema key is written out: params.yaml is the single source of truth.
    assert _keys(_fields(load_params(REPO / "presets/cpu.yaml"))) == _keys(cpu)


#: Where a design's model-dependent outputs go; the Gemma presets move each under artifacts/gemma3-270m/.
#: Not agent_base.out_dir: it is in the design digest, by which a report finds the other model's
#: cells, and its stage persists nothing, so DVC's run cache restores it when the model switches back.
OUTPUT_DIRS = {"injection": ("out_dir",), "fit": ("out_dir",), "unlearning": ("out_dir",),
               "probes": ("out_dir",), "cells": ("out_dir", "controls_dir"), "replay": ("out_dir",),
               "memory": ("out_dir",)}
GEMMA_PAIRS = [("cpu", "cpu-gemma", ""), ("cpu-full", "cpu-full-gemma", "cpu-full-")]


@pytest.mark.parametrize(("smol", "gemma", "suffix"), GEMMA_PAIRS)
def test_a_gemma_preset_is_its_design_on_the_second_family(smol, gemma, suffix):
    """Only the model, the results pages, the other model read beside and the output folders differ."""
    cpu, other = (load_design(REPO / f"presets/{name}.yaml") for name in (smol, gemma))
    assert other.model.path == "models/gemma3-270m"
    pages = {"report": {"results": f"docs/results-{suffix}gemma.md", "models": ["models/smollm2-135m-instruct"]},
             "replay": {"results": f"docs/results-replay-{suffix}gemma.md"},
             "memory": {"results": f"docs/results-memory-{suffix}gemma.md"}}
    for section, folders in OUTPUT_DIRS.items():
        moved = {key: getattr(getattr(cpu, section), key).replace("artifacts/", "artifacts/gemma3-270m/", 1)
                 for key in folders}
        pages[section] = {**pages.get(section, {}), **moved}
    pages["injection"]["calibration"] = cpu.injection.calibration.model_copy(
        update={"study_dir": "artifacts/gemma3-270m/calibration"})
    same = {section: getattr(cpu, section).model_copy(update=values) for section, values in pages.items()}
    assert other == cpu.model_copy(update={**same, "model": cpu.model.model_copy(update={"path": other.model.path})})
    # the design on the other model, as a report reading both models' cells (report.models) looks for it
    assert design_digest(cpu.model_copy(update={"model": other.model})) == design_digest(other)


@pytest.mark.parametrize(("smol", "gemma", "suffix"), GEMMA_PAIRS)
def test_each_model_of_a_pair_writes_every_model_dependent_output_to_its_own_folder(smol, gemma, suffix):
    """Switching back to a model resumes its persisted stages from its own outputs: no stage that
    reads the model writes where the other model's run of the pair writes (compare re-reads MLflow;
    agent_base: OUTPUT_DIRS)."""
    presets = [yaml.safe_load((REPO / f"presets/{name}.yaml").read_text()) for name in (smol, gemma)]

    def resolved(path, params):
        return re.sub(r"\$\{([a-z_.]+)\}", lambda m: str(_lookup(params, m.group(1))), path)

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    checked = 0
    for name, stage in stages.items():
        if "model" not in stage.get("params", []) or name in ("compare", "agent_base"):
            continue
        for out in stage["outs"]:
            path = next(iter(out)) if isinstance(out, dict) else out
            path = path.replace("${item.", "{item.")  # a matrix stage: one folder per item under the param's
            smol_path, gemma_path = (resolved(path, params) for params in presets)
            assert smol_path != gemma_path and not gemma_path.startswith(smol_path + "/"), (name, path)
            checked += 1
    assert checked >= 9


def _lookup(data, key):
    for part in key.split("."):
        data = data[part]
    return data


def test_make_cpu_full_runs_both_families_gemma_first_so_the_cpu_full_report_reads_both():
    full = load_design(REPO / "presets/cpu-full.yaml")
    assert full.report.models == ["models/gemma3-270m"]
    dry = subprocess.run(["make", "-n", "cpu-full"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    steps = [line.split("/")[-1] for line in dry.splitlines() if "preset" in line or "dvc repro" in line]
    assert steps == ["kbench preset cpu-full-gemma", "dvc repro", "kbench preset cpu-full", "dvc repro"], dry


def test_cpu_full_preset_runs_every_method_with_power_and_two_seeds():
    from kbench.methods import all_methods
    from kbench.names import P_RECIPES
    from kbench.observer.power import smallest_p
    from kbench.observer.verdicts import K_REF, K_REF_INF, K_SUP, MF, reachable_classes

    full = load_design(REPO / "presets/cpu-full.yaml")
    default = load_design(REPO / "params.yaml")
    assert full.methods == all_methods()
    assert sorted(full.substrates) == sorted(default.substrates) and full.p_recipes == list(P_RECIPES)
    assert len(full.seeds) >= 2  # tau is defined
    lowest = smallest_p(full.queries.n_per_split * len(full.seeds))
    assert {K_REF_INF, K_REF, K_SUP, MF} <= set(reachable_classes(lowest, full.scoring))
    # Nothing else differs from the CPU default, the methods' sections included.
    changed = {k for k, v in full.model_dump().items() if default.model_dump()[k] != v}
    assert changed <= {"seeds", "queries", "p_recipes", "report", "replay", "memory"}


def test_paper_preset_is_paper_scale():
    paper = load_params(REPO / "presets/paper.yaml")
    assert paper.corpus.n_entities == 5000
    assert paper.queries.n_per_split == 200
    assert paper.seeds == [0, 137, 271]
    assert "Llama-3.1-8B-Instruct" in paper.model.path


def test_unknown_key_is_named():
    with pytest.raises(ParamsError, match="unknown key 'corpus.n_entites'"):
        parse_params({"corpus": {"n_entites": 10}})
    with pytest.raises(ParamsError, match="unknown key 'colour'"):
        parse_params({"colour": "red"})


def test_wrong_type_is_named():
    with pytest.raises(ParamsError, match="key 'queries.n_per_split'"):
        parse_params({"queries": {"n_per_split": "many"}})
    with pytest.raises(ParamsError, match="key 'seeds.1'"):
        parse_params({"seeds": [0, "x"]})
    with pytest.raises(ParamsError, match="unknown field"):
        parse_params({"queries": {"fields": ["shoe_size"]}})
    with pytest.raises(ParamsError, match="key 'injection.mix.bio'"):
        parse_params({"injection": {"mix": {"bio": -1}}})


def test_unreadable_params_file(tmp_path):
    with pytest.raises(ParamsError, match="cannot read params file"):
        load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("corpus: [unclosed")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_cli_refuses_bad_params_before_any_work(kbench_root, capsys):
    bad = kbench_root / "params.yaml"
    bad.write_text("corpus:\n  n_entities: -3\n")
    assert main(["corpus", "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "corpus.n_entities" in err and "Traceback" not in err
    assert not (kbench_root / "artifacts").exists()


def test_preset_command_applies_a_validated_preset(kbench_root, capsys):
    shutil.copytree(REPO / "presets", kbench_root / "presets")
    assert main(["preset", "paper"]) == 0
    assert load_params(kbench_root / "params.yaml").corpus.n_entities == 5000
    assert main(["preset", "huge"]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "key", "registered"),
    [
        ("methods: [none, bogus]\n", "methods", "'noise', 'none'"),
        ("substrates: [C, Q-fake]\n", "substrates", "'C', 'P', 'R-struct', 'R-text'"),
        ("model:\n  backend: vllm-direct\n", "model.backend", "'hf', 'llama-cpp', 'openai'"),
    ],
)
def test_unregistered_names_fail_at_start_up_naming_the_registered_ones(kbench_root, capsys, section, key, registered):
    (kbench_root / "params.yaml").write_text(section)
    assert main(["params"]) == 2
    err = capsys.readouterr().err
    assert f"key '{key}'" in err and registered in err and "Traceback" not in err
    assert main(["corpus", "--no-track"]) == 2  # every stage checks the design before its work
    assert not (kbench_root / "artifacts").exists()


def test_a_lora_section_means_the_same_in_both_places():
    params = parse_params({"agent_base": {"lora": {"rank": 4}}, "injection": {"lora": {"learning_rate": 0.01}}})
    # An override keeps the section's other defaults: the agent base's budget and the recipe's rank.
    assert (params.agent_base.lora.rank, params.agent_base.lora.steps) == (4, 40)
    assert (params.injection.lora.rank, params.injection.lora.epochs, params.injection.lora.learning_rate) == (32, 6, 0.01)
    assert type(params.agent_base.lora).model_fields.keys() == type(params.injection.lora).model_fields.keys()
    with pytest.raises(ParamsError, match="exactly one of epochs and steps"):
        parse_params({"injection": {"lora": {"steps": 10}}})


def test_methods_all_is_every_registered_method_in_a_fixed_order():
    from kbench.methods import all_methods, method_class

    params = check_design(parse_params({"methods": "all"}))
    assert params.methods == all_methods()
    assert [method_class(name).order for name in params.methods] == sorted(method_class(n).order for n in params.methods)
    # The built-in methods keep the order the default run has always listed them in.
    assert params.methods == ["none", "gold", "eco", "star", "leace", "repe", "mlp-probe", "r-lace", "noise", "ga", "gd",
                              "npo", "npo-kl", "simnpo", "idk", "cha", "rmu", "o3", "o3-90", "o3-75", "wga", "undial"]
    # An explicit list is kept as given, in its order.
    assert check_design(parse_params({"methods": ["star", "none"]})).methods == ["star", "none"]


def test_the_loader_fills_each_methods_section_from_its_config():
    from kbench.methods import method_class

    params = check_design(parse_params({"methods": ["none", "eco", "o3"], "method_params": {"eco": {"strength": 2.0}}}))
    assert params.method_params["eco"] == {**method_class("eco").Config().model_dump(mode="json"), "strength": 2.0}
    assert params.method_params["o3"] == method_class("o3").Config().model_dump(mode="json")
    assert "none" not in params.method_params  # a method without keys has no section
    # The noise control matches every registered activation method by default.
    noise = check_design(parse_params({"methods": ["noise"]})).method_params["noise"]
    assert noise["matched_to"] == ["leace", "repe", "mlp-probe", "r-lace"]


def test_a_filled_params_file_is_the_same_design_as_the_short_one(tmp_path):
    """What the loader fills in is what a file that wrote every default out gives (the params
    file before sections were filled): the same params, so the same digests and cells."""
    from kbench.design import design_digest
    from kbench.methods import method_config

    short = load_design(REPO / "params.yaml")
    written = tmp_path / "params.yaml"
    written.write_text(yaml.safe_dump(short.model_dump(mode="json"), sort_keys=False))
    full = load_design(written)
    assert yaml.safe_load(written.read_text())["method_params"]["eco"]["strength"] == 16.0
    assert full == short and design_digest(full) == design_digest(short)
    for name in short.methods:
        assert method_config(name, full).model_dump(mode="json") == method_config(name, short).model_dump(mode="json")


@pytest.mark.parametrize(
    ("method_params", "message"),
    [
        ({"eco": {"strenght": 2.0}}, "unknown key 'method_params.eco.strenght'"),
        ({"eco": {"strength": "loud"}}, "key 'method_params.eco.strength'"),
        ({"bogus": {}}, "key 'method_params': unknown method(s) ['bogus']"),
    ],
)
def test_a_methods_section_that_does_not_validate_is_named_in_one_line(kbench_root, capsys, method_params, message):
    with pytest.raises(ParamsError, match=re.escape(message)):
        check_design(parse_params({"method_params": method_params}))
    (kbench_root / "params.yaml").write_text(yaml.safe_dump({"method_params": method_params}))
    assert main(["params"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
