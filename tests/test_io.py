"""The one atomic writer: a reader sees the old file or the whole new one, never a torn one."""

from __future__ import annotations

import json

import pytest

from kbench import io
from kbench.records import Query


def test_write_json_is_the_project_layout(tmp_path):
    path = io.write_json(tmp_path / "deep" / "m.json", {"b": 1, "a": [1.5]})
    assert path.read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert not list(tmp_path.rglob("*" + io.PARTIAL_SUFFIX))


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = io.write_text(tmp_path / "f.txt", "old\n")
    with pytest.raises(RuntimeError):
        with io.atomic_open(path) as handle:
            handle.write("half of the new")
            raise RuntimeError("killed")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_write_jsonl_writes_models(tmp_path):
    query = Query(query_id="e::employer", entity_id="e", field="employer", question="?", ground_truth="x")
    path = io.write_jsonl(tmp_path / "q.jsonl", [query, query])
    assert [json.loads(line)["query_id"] for line in path.read_text().splitlines()] == ["e::employer"] * 2


def test_atomic_dir_replaces_a_folder_whole_or_not_at_all(tmp_path):
    target = tmp_path / "model"
    with io.atomic_dir(target) as partial:
        (partial / "weights.bin").write_bytes(b"v1")
    assert (target / "weights.bin").read_bytes() == b"v1"
    with pytest.raises(RuntimeError):
        with io.atomic_dir(target) as partial:
            (partial / "weights.bin").write_bytes(b"v2-torn")
            raise RuntimeError("killed")
    assert (target / "weights.bin").read_bytes() == b"v1"
    with io.atomic_dir(target) as partial:
        (partial / "other.bin").write_bytes(b"v3")
    assert sorted(p.name for p in target.iterdir()) == ["other.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_verify_hashes_remembers_unchanged_files_and_never_a_changed_one(tmp_path, monkeypatch):
    import os

    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "weights.bin"
    weights.write_bytes(b"a" * 1000)
    io.write_hashes(folder)
    hashed = []
    real = io.file_sha256
    monkeypatch.setattr(io, "file_sha256", lambda path: hashed.append(path) or real(path))

    io.verify_hashes(folder)
    io.verify_hashes(folder)
    assert len(hashed) == 2  # written just now: a racy time stamp, so checked each time

    old = os.stat(weights).st_mtime_ns - 10 * io.RACY_NS
    os.utime(weights, ns=(old, old))
    io.verify_hashes(folder)
    io.verify_hashes(folder)
    assert len(hashed) == 3  # an old, unchanged file: hashed once, then remembered

    weights.write_bytes(b"b" * 1000)  # same size, same inode, a new modification time
    with pytest.raises(io.IntegrityError, match="weights.bin: content hash"):
        io.verify_hashes(folder)
