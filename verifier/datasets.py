"""EvalPlus-format HumanEval+ / MBPP+ and BFCL v4 task files.

Where a dataset comes from, in order: the `--dataset PATH` the user gives; the project's shared
data folder when present (`../shared/data/...`, or NF_SHARED_DATA); a user cache
(`~/.cache/noisefloor`, or NF_CACHE_DIR) holding a copy downloaded once from the official release
URL, accepted only if its sha256 matches the pinned release.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor.errors import StateError
from noisefloor.verifier.mbpp import deserialize_inputs


@dataclass(frozen=True)
class Release:
    name: str
    filename: str
    url: str
    sha256: str


RELEASES = {
    "humaneval+": Release(
        "humaneval+", "HumanEvalPlus-v0.1.10.jsonl.gz",
        "https://github.com/evalplus/humanevalplus_release/releases/download/v0.1.10/HumanEvalPlus.jsonl.gz",
        "272720b90ac375502c8ed23cd791c2a93dfb22a911641a494da74a426c09f101",
    ),
    "mbpp+": Release(
        "mbpp+", "MbppPlus-v0.2.0.jsonl.gz",
        "https://github.com/evalplus/mbppplus_release/releases/download/v0.2.0/MbppPlus.jsonl.gz",
        "af43697e8791c4c149bdfd6b489d8b5412507551ac20e28a439f650b8225db63",
    ),
}


class DatasetError(StateError):
    """A dataset that cannot be found or read; the message says where it was looked for."""


@dataclass(frozen=True)
class CodeTask:
    task_id: str
    prompt: str
    entry_point: str
    canonical: str  # complete reference program
    inputs: tuple[Any, ...]  # argument lists, base inputs first, then plus
    base_count: int
    atol: float
    kind: str  # "humaneval" or "mbpp"

    def preamble(self) -> str:
        """The prompt up to the entry point's `def`: imports and helper functions a bare body needs."""
        marker = f"def {self.entry_point}"
        idx = self.prompt.find(marker)
        return self.prompt[:idx] if idx >= 0 else ""


def shared_data() -> Path:
    env = os.environ.get("NF_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def cache_dir() -> Path:
    return Path(os.environ.get("NF_CACHE_DIR", Path.home() / ".cache" / "noisefloor"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def locate(suite: str, given: Path | None = None, *, download: bool = True) -> Path:
    if given is not None:
        if not given.is_file():
            raise DatasetError(f"dataset file {given} does not exist; pass the path of an EvalPlus .jsonl(.gz) file")
        return given
    release = RELEASES[suite]
    shared = shared_data() / "evalplus" / release.filename
    if shared.is_file():
        return shared
    cached = cache_dir() / release.filename
    if cached.is_file() and sha256_file(cached) == release.sha256:
        return cached
    if not download:
        raise DatasetError(f"{suite} not found in {shared.parent} or {cached.parent}; pass --dataset PATH")
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".part")
    try:
        urllib.request.urlretrieve(release.url, tmp)  # noqa: S310 - a fixed https URL
    except OSError as exc:
        raise DatasetError(f"could not download {suite} from {release.url} ({exc}); pass --dataset PATH") from None
    if sha256_file(tmp) != release.sha256:
        tmp.unlink(missing_ok=True)
        raise DatasetError(f"downloaded {suite} does not match the pinned sha256 {release.sha256[:12]}; not used")
    tmp.replace(cached)
    return cached


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:
                        raise DatasetError(f"{path}:{n}: not JSON; an EvalPlus file has one task per line") from None
    except (OSError, EOFError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None


DEFAULT_MAX_INPUTS = 120  # inputs per task, base first: the cap every grading path uses by default


def load_code_tasks(suite: str, path: Path, max_inputs: int = DEFAULT_MAX_INPUTS) -> list[CodeTask]:
    """Tasks with their first `max_inputs` inputs (base first), MBPP+ inputs deserialized."""
    kind = "humaneval" if suite == "humaneval+" else "mbpp"
    tasks = []
    for doc in _jsonl(path):
        try:
            base, plus = list(doc["base_input"]), list(doc.get("plus_input") or [])
            if kind == "mbpp":
                base = deserialize_inputs(doc["task_id"], base)
                plus = deserialize_inputs(doc["task_id"], plus)
            inputs = (base + plus)[:max_inputs]
            canonical = doc["canonical_solution"]
            if kind == "humaneval":
                canonical = doc["prompt"] + canonical
            tasks.append(CodeTask(doc["task_id"], doc["prompt"], doc["entry_point"], canonical, tuple(inputs),
                                  min(len(base), max_inputs), float(doc.get("atol") or 0), kind))
        except (KeyError, TypeError) as exc:
            raise DatasetError(f"{path}: task {doc.get('task_id', '?')} lacks field {exc}; is this an EvalPlus file?") from None
    if not tasks:
        raise DatasetError(f"{path} holds no tasks")
    return tasks


@dataclass(frozen=True)
class ToolTask:
    task_id: str
    question: list[list[dict[str, str]]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]]
    category: str  # "multiple" or "parallel"


def load_bfcl(category: str, folder: Path | None = None) -> list[ToolTask]:
    folder = folder or shared_data() / "bfcl"
    q, a = folder / f"BFCL_v4_{category}.json", folder / f"possible_answer_BFCL_v4_{category}.json"
    for p in (q, a):
        if not p.is_file():
            raise DatasetError(f"BFCL file {p} not found; pass --dataset FOLDER holding the BFCL v4 files")
    answers = {d["id"]: d["ground_truth"] for d in _jsonl(a)}
    return [ToolTask(d["id"], d["question"], d["function"], answers[d["id"]], category) for d in _jsonl(q)
            if d["id"] in answers]
