"""EvalPlus-format HumanEval+ / MBPP+ and BFCL v4 task files.

Where a dataset comes from, in order: the `--dataset PATH` the user gives; the project's shared
data folder when present (`../shared/data/...`, or NF_SHARED_DATA); a user cache
(`~/.cache/noisefloor`, or NF_CACHE_DIR) holding a copy downloaded once from the official release
URL, accepted only if its sha256 matches the pinned release.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor import bounded
from noisefloor.errors import StateError
from noisefloor.verifier.mbpp import deserialize_inputs

_REQUIRED = object()


@dataclass(frozen=True)
class Release:
    filename: str
    url: str
    sha256: str


RELEASES = {
    "humaneval+": Release(
        "HumanEvalPlus-v0.1.10.jsonl.gz",
        "https://github.com/evalplus/humanevalplus_release/releases/download/v0.1.10/HumanEvalPlus.jsonl.gz",
        "272720b90ac375502c8ed23cd791c2a93dfb22a911641a494da74a426c09f101",
    ),
    "mbpp+": Release(
        "MbppPlus-v0.2.0.jsonl.gz",
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


def _jsonl(path: Path, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) of a JSON Lines file, plain or gzipped, read within the bounds of `bounded`."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            yield from bounded.json_lines(fh, str(path), DatasetError, what=what)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"cannot read {path}: {exc}; check the file (a damaged download?) or pass another "
                           "--dataset") from None


def _field(path: Path, n: int, doc: dict[str, Any], name: str, kind: type | tuple[type, ...],
           default: Any = _REQUIRED) -> Any:
    """`doc[name]` of type `kind`, else one line naming the file, the line and the field."""
    if name not in doc:
        if default is _REQUIRED:
            raise DatasetError(f"{path}:{n}: no field {name!r}; is this the right file for this suite?")
        return default
    value = doc[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise DatasetError(f"{path}:{n}: field {name!r} is a {type(value).__name__}, not a {names}; the file is "
                           "damaged or not the kind expected")
    return value


DEFAULT_MAX_INPUTS = 120  # inputs per task, base first: the cap every grading path uses by default


def load_code_tasks(suite: str, path: Path, max_inputs: int = DEFAULT_MAX_INPUTS) -> list[CodeTask]:
    """Tasks with their first `max_inputs` inputs (base first), MBPP+ inputs deserialized."""
    kind = "humaneval" if suite == "humaneval+" else "mbpp"
    tasks = [_code_task(path, n, doc, kind, max_inputs) for n, doc in _jsonl(path, "one EvalPlus task per line")]
    if not tasks:
        raise DatasetError(f"{path} holds no tasks; pass an EvalPlus .jsonl(.gz) file")
    return tasks


def _code_task(path: Path, n: int, doc: dict[str, Any], kind: str, max_inputs: int) -> CodeTask:
    task_id = _field(path, n, doc, "task_id", str)
    base = list(_field(path, n, doc, "base_input", list))
    plus = list(_field(path, n, doc, "plus_input", list)) if doc.get("plus_input") else []  # MBPP+ has one {}
    if kind == "humaneval" and not all(isinstance(a, list) for a in base + plus):
        raise DatasetError(f"{path}:{n}: task {task_id}: every input must be a list of arguments")
    if kind == "mbpp":
        try:
            base = deserialize_inputs(task_id, base)
            plus = deserialize_inputs(task_id, plus)
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise DatasetError(f"{path}:{n}: task {task_id}: inputs not readable ({exc}); the file is "
                               "damaged") from None
    prompt = _field(path, n, doc, "prompt", str)
    entry = _field(path, n, doc, "entry_point", str)
    if not entry.isidentifier():
        raise DatasetError(f"{path}:{n}: task {task_id}: entry_point {entry[:40]!r} is not a Python name")
    canonical = _field(path, n, doc, "canonical_solution", str)
    atol = _field(path, n, doc, "atol", (int, float), 0) or 0
    return CodeTask(task_id, prompt, entry, prompt + canonical if kind == "humaneval" else canonical,
                    tuple((base + plus)[:max_inputs]), float(atol), kind)


@dataclass(frozen=True)
class ToolTask:
    task_id: str
    question: list[list[dict[str, str]]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]]
    category: str  # "multiple" or "parallel"


def load_bfcl(category: str, folder: Path | None = None) -> list[ToolTask]:
    """The BFCL v4 tasks of `category` that have an answer, each typed (question turns of role and
    content, declared functions, answers of {function: {parameter: allowed values}})."""
    folder = folder or shared_data() / "bfcl"
    q, a = folder / f"BFCL_v4_{category}.json", folder / f"possible_answer_BFCL_v4_{category}.json"
    for p in (q, a):
        if not p.is_file():
            raise DatasetError(f"BFCL file {p} not found; pass --dataset FOLDER holding the BFCL v4 files")
    answers = {_field(a, n, d, "id", str): _answers(a, n, d) for n, d in _jsonl(a, "one BFCL answer per line")}
    tasks = []
    for n, d in _jsonl(q, "one BFCL task per line"):
        tid = _field(q, n, d, "id", str)
        if tid in answers:
            tasks.append(ToolTask(tid, _question(q, n, d), _functions(q, n, d), answers[tid], category))
    return tasks


def _bad(path: Path, n: int, what: str) -> DatasetError:
    return DatasetError(f"{path}:{n}: {what}; the file is damaged or not a BFCL v4 file")


def _question(path: Path, n: int, doc: dict[str, Any]) -> list[list[dict[str, str]]]:
    turns = _field(path, n, doc, "question", list)
    ok = turns and all(isinstance(t, list) and t and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                         for m in t) for t in turns)
    if not ok:
        raise _bad(path, n, "'question' must be a list of turns, each a list of messages with a text 'content'")
    return turns


def _functions(path: Path, n: int, doc: dict[str, Any]) -> list[dict[str, Any]]:
    functions = _field(path, n, doc, "function", list)
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions):
        raise _bad(path, n, "'function' must be a list of declarations, each with a 'name'")
    return functions


def _answers(path: Path, n: int, doc: dict[str, Any]) -> list[dict[str, dict[str, list[Any]]]]:
    truth = _field(path, n, doc, "ground_truth", list)
    for call in truth:
        if not (isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict)
                and all(isinstance(v, list) for v in next(iter(call.values())).values())):
            raise _bad(path, n, "each 'ground_truth' entry must be {function: {parameter: [allowed values]}}")
    return truth
