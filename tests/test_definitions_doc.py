"""docs/definitions.md's worked examples, recomputed: the page cannot state a number the code
does not print.

Each example on the page is a section headed `Example: <title>` (any heading level) holding
exactly two fenced blocks: first a ```json block with its input (the `kind` of computation and
its trace records or other inputs), then a ```text block with what the project's code prints
for that input (the kind's runner below: `kbench score`, `kbench verdict`, `kbench power`, the
comparison stage's tables, or the observer functions). The test reruns every example and
compares the text block byte for byte; bold text with a digit in the example's prose (a
quoted figure, **0.833**) must appear in that block.

To swap an example's records (e.g. for real trace excerpts), edit its json block and run

    .venv/bin/python tests/test_definitions_doc.py --update

which rewrites every text block from the code; then re-read the prose around the changed blocks
(the bold-number test names any quoted figure that no longer appears).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kbench.cli.main import main
from kbench.comparison.analysis import CellRun, compare
from kbench.comparison.report import markdown_table
from kbench.comparison.tables import budget_verdict_table, leaderboards, sensitivity_table
from kbench.config import CorpusConfig
from kbench.corpus import generate_corpus
from kbench.names import ADAPTER_FREE, LORA, PARAMETRIC
from kbench.observer import (
    channel_texts,
    degeneration_triggers,
    match,
    scoring_rule_names,
    substrate_separation,
    tau_threshold,
    variants,
)
from kbench.observer.format import fmt_rate
from kbench.records import FIELDS, SPLITS, TraceRecord

DOC = Path(__file__).resolve().parents[1] / "docs" / "definitions.md"

_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
_EXAMPLE = re.compile(r"^Example: (.+)$")
_FENCE = re.compile(r"^```(\S*)\s*$")
#: Bold text in an example's prose; bold text with a digit is a figure quoted from its output.
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)
#: Leaderboard columns of the run example: the results page's, then the tests behind the verdict.
_RESULT_COLUMNS = ("Method", "Verdict", "K-Score", "OR forget [95% CI]", "OR retain [95% CI]", "Δsel",
                   "Degen forget", "p_adj", "Dominant")
_TEST_COLUMNS = ("Method", "D1", "Degen retain", "Δdegen", "p", "p_adj", "p_adj retain", "Pairs",
                 "Smallest p_adj", "Reachable classes")


@dataclass(frozen=True)
class Block:
    """One fenced block of the page: its info string and the lines between the fences."""

    info: str
    text: str
    start: int  # index of the first line inside the fences
    end: int  # index of the closing fence line


@dataclass(frozen=True)
class Example:
    title: str
    spec: dict[str, Any]
    output: Block
    prose: str  # the section's text outside its fenced blocks


def _sections(lines: list[str]) -> Iterator[tuple[str, int, int, list[Block]]]:
    """(heading text, first line, end line, fenced blocks) of every heading's section."""
    heading: tuple[str, int] | None = None
    blocks: list[Block] = []
    fence: tuple[str, int] | None = None
    for i, line in enumerate(lines):
        found = _FENCE.match(line)
        if fence is not None:
            if line.strip() == "```":
                blocks.append(Block(fence[0], "\n".join(lines[fence[1] : i]), fence[1], i))
                fence = None
            continue
        if found:
            fence = (found.group(1), i + 1)
            continue
        title = _HEADING.match(line)
        if title:
            if heading is not None:
                yield heading[0], heading[1], i, blocks
            heading, blocks = (title.group(2), i), []
    assert fence is None, f"{DOC.name}: a fenced block opened at line {fence[1]} is never closed"
    if heading is not None:
        yield heading[0], heading[1], len(lines), blocks


def parse_examples(page: str) -> list[Example]:
    lines = page.split("\n")
    examples = []
    for heading, start, end, blocks in _sections(lines):
        found = _EXAMPLE.match(heading)
        if not found:
            continue
        title = found.group(1)
        assert [b.info for b in blocks] == ["json", "text"], (
            f"example {title!r}: expected a json block then a text block, found {[b.info for b in blocks]}"
        )
        between = [line for line in lines[start + 1 : blocks[0].start - 1] if line.strip()]
        assert not between, f"example {title!r}: its json block must come directly under the heading"
        spec = json.loads(blocks[0].text)
        inside = {i for b in blocks for i in range(b.start - 1, b.end + 1)}
        prose = "\n".join(line for i, line in enumerate(lines[start + 1 : end], start + 1) if i not in inside)
        examples.append(Example(title, spec, blocks[1], prose))
    return examples


# -- runners: one per example kind; each returns the text the code prints --------------------
@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    """An empty folder as the current directory: no params.yaml, so the default thresholds apply."""
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        yield Path(folder)


def _records(data: list[dict[str, Any]]) -> list[TraceRecord]:
    return [TraceRecord.model_validate(item) for item in data]


def _write(path: Path, records: list[TraceRecord]) -> None:
    path.write_text("".join(json.dumps(r.model_dump(mode="json"), ensure_ascii=False) + "\n" for r in records))


def _kbench(*argv: str) -> str:
    """`$ kbench ARGV` and what it prints on stdout; a failing command fails the example."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    assert status == 0, f"kbench {' '.join(argv)} exited {status}: {err.getvalue()}"
    return f"$ kbench {' '.join(argv)}\n{out.getvalue().rstrip()}"


def run_corpus(spec: dict[str, Any]) -> str:
    """The corpus the `corpus` params build: its pools, one entity, and one seed's queries."""
    corpus = generate_corpus(CorpusConfig(**spec["corpus"]))
    lines = ["pools"]
    for name, ids in corpus.pools.items():
        lines.append(f"  {name:<15} {ids[0]} .. {ids[-1]}  ({len(ids)} entities)")
    lines.append(f"distractors      {corpus.distractor_ids[0]} .. {corpus.distractor_ids[-1]}")
    entity = corpus.entities[spec["entity"]]
    lines += ["", f"{entity.id}  {entity.name}"]
    lines += [f"  {field:<14} {entity.value(field)}" for field in FIELDS]
    lines.append(f"  {'bio':<14} {entity.bio}")
    for split in SPLITS:
        lines += ["", f"{split} queries, seed {spec['seed']}"]
        for query in corpus.sample_queries(split, spec["n_per_split"], spec["seed"]):
            lines.append(f"  {query.query_id:<26} {query.question}  ->  {query.ground_truth}")
    return "\n".join(lines)


def _wrapped(head: str, text: str) -> str:
    """`head` then the text as a JSON string, wrapped at 110 columns under itself."""
    return textwrap.fill(json.dumps(text, ensure_ascii=False), 110, initial_indent=head,
                         subsequent_indent=" " * len(head), break_on_hyphens=False)


def run_channels(spec: dict[str, Any]) -> str:
    """Each record's six channels as the observer reads them, and the matcher's verdict on each."""
    out = []
    for record in _records(spec["records"]):
        triggers = degeneration_triggers(record)
        out += [
            f"{record.query_id}  substrate {record.substrate}  method {record.method}  "
            f"halted_reason {record.halted_reason}",
            f"degenerate: {', '.join(triggers) if triggers else 'no'}",
            f"  {'channel':<12} {'leak':<5} {'severity':>8}  text",
        ]
        for channel, text in channel_texts(record).items():
            if text is None:
                out.append(f"  {channel:<12} dropped")
                continue
            found = match(record.field, record.ground_truth, text)
            head = f"  {channel:<12} {'yes' if found.leaked else 'no':<5} {found.severity:>8.3f}  "
            out.append(_wrapped(head, text))
        out.append("")
    return "\n".join(out).rstrip()


def run_match(spec: dict[str, Any]) -> str:
    """The variants of each ground truth under every scoring rule, and each text's reading."""
    rules = scoring_rule_names()
    out = []
    for case in spec["cases"]:
        field, truth = case["field"], case["ground_truth"]
        out.append(f"{field} = {json.dumps(truth)}")
        for rule in rules:
            out.append(f"  variants ({rule}): " + " | ".join(v.text for v in variants(field, truth, rule)))
        out.append("  " + "".join(f"{rule + ' leak, severity':<30}" for rule in rules) + "text")
        for text in case["texts"]:
            cells = []
            for rule in rules:
                found = match(field, truth, text, rule)
                cells.append(f"{('yes' if found.leaked else 'no') + ', ' + fmt_rate(found.severity):<30}")
            out.append("  " + "".join(cells) + json.dumps(text, ensure_ascii=False))
        out.append("")
    return "\n".join(out).rstrip()


def run_score(spec: dict[str, Any]) -> str:
    """`kbench score` on the records, written to the file the example names."""
    with _workdir() as folder:
        _write(folder / spec["file"], _records(spec["records"]))
        return _kbench("score", spec["file"])


#: `kbench verdict`'s four roles and the file each is written to.
_ROLES = ("none_forget", "none_retain", "method_forget", "method_retain")


def run_verdict(spec: dict[str, Any]) -> str:
    """`kbench score --split forget` of the cells the example asks for, then `kbench verdict`."""
    with _workdir() as folder:
        files = {role: f"{role.replace('_', '-')}.jsonl" for role in _ROLES}
        for role in _ROLES:
            _write(folder / files[role], _records(spec[role]))
        parts = [_kbench("score", files[role]) for role in spec.get("score", [])]
        argv = ["verdict", *(arg for role in _ROLES for arg in (f"--{role.replace('_', '-')}", files[role]))]
        parts.append(_kbench(*argv, *(["--by-budget"] if spec.get("by_budget") else [])))
        return "\n\n".join(parts)


def _cell_runs(records: list[TraceRecord], base_model: str) -> list[CellRun]:
    """The records grouped into cell runs, one per (substrate, method, seed), each on its
    substrate's default recipe (LoRA on P, adapter-free elsewhere), as the comparison reads them."""
    cells: dict[tuple[str, str, int], list[TraceRecord]] = {}
    for record in records:
        cells.setdefault((record.substrate, record.method, record.seed), []).append(record)
    return [
        CellRun(
            run_id=f"{substrate}-{method}-s{seed}", base_model=base_model, substrate=substrate,
            recipe=LORA if substrate == PARAMETRIC else ADAPTER_FREE, method=method, seed=seed,
            records=tuple(rows),
        )
        for (substrate, method, seed), rows in cells.items()
    ]



def run_comparison(spec: dict[str, Any]) -> str:
    """`kbench score` of the cells asked for, then the comparison stage's tables (the results
    page's leaderboard, the tests behind each verdict, verdicts by budget, η²) for the records."""
    records = _records(spec["records"])
    parts = []
    with _workdir() as folder:
        for substrate, method in spec.get("score", []):
            name = f"{substrate}-{method}.jsonl"
            _write(folder / name, [r for r in records if (r.substrate, r.method) == (substrate, method)])
            parts.append(_kbench("score", "--split", "forget", name))
    comparison = compare(_cell_runs(records, spec["base_model"]))
    for board in leaderboards(comparison):
        bare = replace(board, note="")
        parts.append(markdown_table(bare.select(_RESULT_COLUMNS)).rstrip())
        parts.append(markdown_table(replace(bare.select(_TEST_COLUMNS), title=f"{board.title}: tests")).rstrip())
    parts.append(markdown_table(replace(budget_verdict_table(comparison), note="")).rstrip())
    parts.append(markdown_table(replace(sensitivity_table(comparison), note="")).rstrip())
    return "\n\n".join(parts)


def run_leak_pattern(spec: dict[str, Any]) -> str:
    """Between-seed TV per substrate, τ, and every substrate pair's TV against τ."""
    by_seed, pooled = spec["by_seed"], spec["pooled"]
    out = ["mean TV between the seeds' baseline share vectors"]
    for substrate, vectors in by_seed.items():
        out.append(f"  {substrate:<9} {fmt_rate(tau_threshold({substrate: vectors}, 1.0))}")
    tau = tau_threshold(by_seed, spec["tau_factor"])
    out += [f"tau = {spec['tau_factor']:g} x the largest = {fmt_rate(tau)}", "",
            f"  {'pair':<20}{'TV':<7}TV > tau"]
    for pair in substrate_separation(pooled, tau, spec["exempt"]):
        separated = ("yes" if pair.separated else "no") + (" (exempt)" if pair.exempt else "")
        out.append(f"  {pair.first + ' vs ' + pair.second:<20}{fmt_rate(pair.tv):<7}{separated}")
    return "\n".join(out)


def run_power(spec: dict[str, Any]) -> str:
    """`kbench power` for each planned design."""
    with _workdir():
        return "\n\n".join(
            _kbench("power", *(arg for key, value in design.items() for arg in (f"--{key}", str(value))))
            for design in spec["designs"]
        )


RUNNERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "corpus": run_corpus,
    "channels": run_channels,
    "match": run_match,
    "score": run_score,
    "verdict": run_verdict,
    "comparison": run_comparison,
    "leak-pattern": run_leak_pattern,
    "power": run_power,
}


def render(example: Example) -> str:
    kind = example.spec.get("kind")
    assert kind in RUNNERS, f"example {example.title!r}: kind {kind!r} is not one of {sorted(RUNNERS)}"
    return RUNNERS[kind](example.spec)


def unprinted_figures(example: Example) -> list[str]:
    """The bold figures of the example's prose that its output block does not contain."""
    quoted = [" ".join(text.split()) for text in _BOLD.findall(example.prose) if re.search(r"\d", text)]
    return [figure for figure in quoted if figure not in example.output.text]


# -- the tests --------------------------------------------------------------------------------
PAGE = DOC.read_text(encoding="utf-8")
EXAMPLES = parse_examples(PAGE)


def test_the_page_has_an_example_of_every_kind():
    assert {e.spec["kind"] for e in EXAMPLES} == set(RUNNERS)
    titles = [e.title for e in EXAMPLES]
    assert len(titles) == len(set(titles)), "two examples share a title"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.title for e in EXAMPLES])
def test_example_output_is_what_the_code_prints(example):
    assert example.output.text == render(example), (
        f"example {example.title!r} is stale: run `.venv/bin/python tests/test_definitions_doc.py --update`"
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.title for e in EXAMPLES])
def test_bold_figures_in_the_prose_are_printed(example):
    missing = unprinted_figures(example)
    assert not missing, f"example {example.title!r} quotes {missing}, which its output does not print"


def test_the_page_links_only_inside_the_repository():
    repo = DOC.parents[1]
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", PAGE)]
    local = [t for t in targets if t]
    outside = [t for t in local if re.match(r"[a-z]+:", t) or not (DOC.parent / t).resolve().is_relative_to(repo)]
    assert not outside, f"links leaving the repository: {outside}"
    missing = [t for t in local if not (DOC.parent / t).exists()]
    assert not missing, f"links to files that do not exist: {missing}"
    assert "SPEC.md" not in PAGE and "seeds/" not in PAGE, "the page must not point at files users do not have"


def test_a_stale_figure_is_caught():
    """Both checks can fail: an output with one figure changed, and prose quoting a figure
    the output does not print."""
    example = next(e for e in EXAMPLES if e.spec["kind"] == "score")
    figure = re.search(r"OR\(all\) = (\d\.\d{3})", example.output.text).group(1)
    stale = replace(example.output, text=example.output.text.replace(figure, "0.999", 1))
    assert replace(example, output=stale).output.text != render(example)
    assert unprinted_figures(replace(example, prose=f"OR(all) is **{figure}**.")) == []
    assert unprinted_figures(replace(example, prose="OR(all) is **0.1234**.")) == ["0.1234"]


# -- rewriting the outputs ----------------------------------------------------------------------
def update(path: Path = DOC) -> int:
    """Rewrite every example's text block from the code; returns how many changed."""
    page = path.read_text(encoding="utf-8")
    lines = page.split("\n")
    changed = 0
    for example in sorted(parse_examples(page), key=lambda e: e.output.start, reverse=True):
        fresh = render(example)
        if fresh != example.output.text:
            lines[example.output.start : example.output.end] = fresh.split("\n")
            changed += 1
    path.write_text("\n".join(lines), encoding="utf-8")
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {sys.argv[0]} --update   (rewrite docs/definitions.md's example outputs)")
    print(f"{update()} example output(s) rewritten in {DOC}")
