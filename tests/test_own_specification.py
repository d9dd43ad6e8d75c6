"""The project defines itself: code, docs, params and presets cite the project's own docs.

Definitions live in docs/definitions.md (K-Bench itself), docs/replay.md (the execution-state
lane) and docs/memory.md (the memory lane). A citation names a page and one of its sections,
`docs/definitions.md, "The matcher"` in code and params, `[definitions.md](definitions.md),
"The matcher"` in the docs, and that section must exist: a heading (its first words do) or a
paragraph's bold lead-in. Nothing may cite a specification
outside the repository ("SPEC §n") or call a paper "the seed".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What the project's own text is made of: the package, the docs, the params and the pipeline.
SCANNED = ("src", "docs", "params.yaml", "presets", "dvc.yaml")

#: Phrases that point outside the repository or name a paper "the seed" (case-insensitive).
FORBIDDEN = re.compile(r"SPEC §|SPEC\.md|beyond the seed|the seed's|seed paper", re.IGNORECASE)

#: A citation: an optional docs/ prefix, a page, an optional Markdown link target, a quoted heading.
CITATION = re.compile(r'(docs/)?([\w-]+\.md)(?:\]\([^)\s]*\))?, "([^"\n]+)"')

#: Each lane's definitions page names the paper it follows by its title.
TITLES = {
    "docs/definitions.md": "K-Bench: A Benchmark for LLM Unlearning in Agentic Deployments",
    "docs/replay.md": "Forgetting without restart: execution-state forgetting for stateful LLM agents",
    "docs/memory.md": "Can Agents Forget When Asked? A Benchmark for Memory Unlearning in LLM Agents",
}


def _files() -> list[Path]:
    found = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found += [p for p in candidates if "__pycache__" not in p.parts]
    return found


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # an image or other binary file: nothing to cite
        return None


TEXTS = {p.relative_to(ROOT).as_posix(): t for p in _files() if (t := _text(p)) is not None}


def _names(heading: str) -> set[str]:
    """A heading's text, without its section number, and without a trailing parenthesis."""
    text = heading.strip()
    bare = re.sub(r"^\d+\.\s+", "", text)
    return {text, bare, re.sub(r"\s*\([^()]*\)$", "", bare)}


def _sections(page: Path) -> set[str]:
    """The names a citation may use: every heading's, and every paragraph's bold lead-in."""
    names: set[str] = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if (m := re.match(r"#{1,6}\s+(.+?)\s*$", line)):
            names |= _names(m.group(1))
        elif (m := re.match(r"\s*(?:[-*]\s+)?\*\*([^*]+?)[.:]?\*\*", line)):
            names.add(m.group(1).strip())
    return names


def _found(cited: str, names: set[str]) -> bool:
    """The cited name is a section's, or the first words of one ("Weight methods" for "Weight methods on P")."""
    return any(name == cited or re.match(re.escape(cited) + r"[\s:(]", name) for name in names)


def _citations() -> list[tuple[str, int, Path, str]]:
    found = []
    for rel, text in TEXTS.items():
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in CITATION.finditer(line):
                prefix, page, heading = m.groups()
                target = ROOT / "docs" / page if prefix or not rel.startswith("docs/") else (ROOT / rel).parent / page
                found.append((rel, lineno, target, heading))
    return found


def test_the_scan_reads_the_project():
    assert "src/kbench/observer/matcher.py" in TEXTS and "docs/definitions.md" in TEXTS and "params.yaml" in TEXTS


def test_no_outside_specification_and_no_seed_paper():
    hits = [f"{rel}:{n}: {line.strip()[:120]}" for rel, text in TEXTS.items()
            for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]
    assert not hits, "cite the project's docs (docs/definitions.md, docs/replay.md, docs/memory.md) instead:\n" + "\n".join(hits)


def test_the_scan_catches_what_it_forbids():
    for phrase in ("(SPEC §7)", "beyond the seed", "The seed's Table 3", "the Seed Paper"):
        assert FORBIDDEN.search(phrase), phrase
    assert not FORBIDDEN.search("the seed of the cell's query sample; seeds 0, 137 and 271")


def test_the_definitions_are_cited():
    cited = {(target.relative_to(ROOT).as_posix(), heading) for _, _, target, heading in _citations()}
    for page in ("docs/definitions.md", "docs/replay.md", "docs/memory.md"):
        assert any(p == page for p, _ in cited), f"nothing cites {page}"


@pytest.mark.parametrize("citation", _citations(), ids=lambda c: f"{c[0]}:{c[1]}")
def test_every_cited_heading_exists(citation):
    rel, lineno, target, heading = citation
    assert target.is_file(), f"{rel}:{lineno} cites {target.relative_to(ROOT)}, which does not exist"
    assert _found(heading, _sections(target)), f"{rel}:{lineno} cites {target.name}, \"{heading}\": no such section"


@pytest.mark.parametrize("page", sorted(TITLES))
def test_each_definitions_page_names_its_paper(page):
    assert " ".join(TITLES[page].split()) in " ".join((ROOT / page).read_text(encoding="utf-8").split())
