"""The discoverable command line: `kbench list`, `--version`, the grouped help, each stage's
options parsed into its typed `Options`, and `kbench preset` keeping an edited params.yaml."""

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbench.backends import backend_names
from kbench.cli.catalog import KINDS
from kbench.cli.main import build_parser, main
from kbench.memory.systems import memory_system_names
from kbench.observer.matcher import scoring_rule_names
from kbench.methods import method_class, method_names
from kbench.probes.summary import PROBES
from kbench.substrates import substrate_names

REPO = Path(__file__).resolve().parents[1]
#: The stages that run a process pool: their workers are pool processes, not `kbench` children.
POOL_STAGES = ("cell", "inject", "probes", "unlearn")


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_list_methods_json_has_every_registered_method_with_its_substrates(capsys):
    status, out, _ = run(capsys, "list", "methods", "--json")
    assert status == 0
    rows = json.loads(out)
    assert [row["name"] for row in rows] == method_names()
    for row in rows:
        assert list(row) == ["name", "family", "substrates", "description"]
        assert row["substrates"] == sorted(method_class(row["name"]).substrates)
        assert row["family"] == getattr(method_class(row["name"]), "family", None)
    assert next(row for row in rows if row["name"] == "ga")["substrates"] == ["P"]


@pytest.mark.parametrize(("kind", "names"), [
    ("substrates", substrate_names()), ("backends", backend_names()), ("probes", list(PROBES)),
    ("memory-systems", memory_system_names()), ("rules", scoring_rule_names()),
])  # fmt: skip
def test_list_json_names_come_from_the_registries(capsys, kind, names):
    status, out, _ = run(capsys, "list", kind, "--json")
    assert status == 0
    rows = json.loads(out)
    assert [row["name"] for row in rows] == names and all(row["name"] for row in rows)


def test_list_memory_systems_says_which_call_an_endpoint(capsys):
    status, out, _ = run(capsys, "list", "memory-systems", "--json")
    assert status == 0
    endpoint = {row["name"]: row["endpoint"] for row in json.loads(out)}
    assert endpoint["mem0"] is True and endpoint["full-context"] is False and endpoint["reference"] is False


def test_list_table_is_aligned_under_a_header(capsys):
    status, out, _ = run(capsys, "list", "substrates")
    assert status == 0
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "DESCRIPTION"] and len(lines) == len(substrate_names())
    column = header.index("DESCRIPTION")
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines)


def test_list_presets_reads_the_first_comment_line(kbench_root, capsys):
    (kbench_root / "presets").mkdir()
    (kbench_root / "presets" / "tiny.yaml").write_text("seeds: [0]\n# A tiny design for a smoke test.\n# more\n")
    status, out, _ = run(capsys, "list", "presets", "--json")
    assert status == 0
    assert json.loads(out) == [{"name": "tiny", "path": "presets/tiny.yaml",
                                "description": "A tiny design for a smoke test."}]


def test_an_unknown_kind_is_one_line_naming_the_known_ones(capsys):
    status, out, err = run(capsys, "list", "recipes")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "unknown kind 'recipes'" in err and all(kind in err for kind in KINDS)


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kbench {importlib.metadata.version('kbench')}"


def test_console_script_prints_the_version():
    done = subprocess.run([sys.executable, "-m", "kbench.cli.main", "--version"], capture_output=True, text=True,
                          check=True)
    assert done.stdout.startswith("kbench ") and done.stdout.split()[1][0].isdigit()


def test_help_groups_the_pipeline_stages(capsys):
    text = help_text(capsys)
    stages = text.split("pipeline stages")[1].split("\n\n")[0]
    assert [line.split()[0] for line in stages.splitlines()[1:] if line.startswith("  ") and line[2] != " "] == [
        "corpus", "index", "agent-base", "inject", "fit", "unlearn", "probes", "cell", "replay-run", "memory-instances",
        "memory-run", "memory-report", "compare"]
    assert "scoring" in text and "project tools" in text and "  list " in text


@pytest.mark.parametrize("stage", POOL_STAGES)
def test_a_stage_has_no_child_protocol_flag(stage, capsys):
    """Pool workers take objects, not a command line: no hidden `--queue` flag is left."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([stage, "--queue"])
    assert exit_.value.code == 2 and "unrecognized arguments: --queue" in capsys.readouterr().err


def test_a_stage_command_line_becomes_its_typed_options():
    from kbench.cli.app import stage_options
    from kbench.stages import cell, unlearn

    args = build_parser().parse_args(["cell", "--substrate", "C", "--seed", "3", "--method", "eco", "--method",
                                      "repe", "--no-track", "--index", "x/index", "--params", "other.yaml"])
    options = stage_options(cell, args)
    assert options == cell.Options(substrate="C", seed=3, method=("eco", "repe"), track=False, index=Path("x/index"))
    assert args.params == "other.yaml"
    assert stage_options(cell, build_parser().parse_args(["cell"])) == cell.Options()
    options = stage_options(unlearn, build_parser().parse_args(["unlearn", "--run", "ga/lora", "--workers", "1"]))
    assert options == unlearn.Options(run=("ga/lora",), workers=1)


def test_no_argparse_below_the_command_line():
    """Stage logic takes typed options: `argparse` is imported under kbench/cli only."""
    offenders = [path.relative_to(REPO).as_posix() for path in (REPO / "src" / "kbench").rglob("*.py")
                 if "cli" not in path.relative_to(REPO / "src" / "kbench").parts[:1]
                 and ("import argparse" in path.read_text() or "from argparse" in path.read_text())]
    assert offenders == []


@pytest.fixture
def project(kbench_root):
    """A project folder holding the repository's presets."""
    shutil.copytree(REPO / "presets", kbench_root / "presets")
    return kbench_root


def test_preset_help_lists_the_presets_found(project, capsys):
    names = sorted(path.stem for path in (project / "presets").glob("*.yaml"))
    assert all(name in help_text(capsys, "preset") for name in names)


def test_preset_refuses_an_edited_params_file_and_force_replaces_it(project, capsys):
    params = project / "params.yaml"
    edited = (project / "presets" / "cpu.yaml").read_text() + "seeds: [7]\n"
    params.write_text(edited)
    status, _, err = run(capsys, "preset", "paper")
    assert status == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    assert params.read_text() == edited
    status, _, _ = run(capsys, "preset", "paper", "--force")
    assert status == 0 and params.read_bytes() == (project / "presets" / "paper.yaml").read_bytes()


def test_preset_replaces_a_preset_copy_and_ignores_comments(project, capsys):
    """A params file compares by its YAML data: a preset with a comment added is still that preset."""
    params = project / "params.yaml"
    params.write_text("# my note\n" + (project / "presets" / "cpu.yaml").read_text())
    assert run(capsys, "preset", "paper")[0] == 0
    assert params.read_bytes() == (project / "presets" / "paper.yaml").read_bytes()


def test_preset_refuses_a_params_file_that_is_not_yaml(project, capsys):
    (project / "params.yaml").write_text("seeds: [0\n")
    status, _, err = run(capsys, "preset", "cpu")
    assert status == 2 and "--force" in err


def test_preset_writes_a_missing_params_file(project, capsys):
    assert run(capsys, "preset", "cpu")[0] == 0
    assert (project / "params.yaml").read_bytes() == (project / "presets" / "cpu.yaml").read_bytes()
