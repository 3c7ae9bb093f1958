"""Which tasks an nfladder run uses: the suite named by --suite (built-in, HumanEval+, MBPP+ or
an EvalPlus-format file) and the ids named by --task-ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def suite(name: str, out: Path) -> tuple[list[Any], Path, str]:
    """Tasks, the EvalPlus-format file to grade against, and the verifier's suite kind."""
    from noisefloor.verifier.datasets import DatasetError, load_code_tasks, locate

    if name == "builtin":
        from noisefloor.ladder.suite import builtin_suite, write_dataset

        tasks = builtin_suite()
        path = write_dataset(tasks, out / "suite.jsonl.gz")
        return tasks, path, "humaneval+"
    try:
        if name in ("humaneval+", "mbpp+"):
            path = locate(name)
            kind = name
        else:  # a file in EvalPlus format (HumanEval-style prompts)
            path, kind = Path(name), "humaneval+"
            if not path.is_file():
                raise DatasetError(f"suite {name!r} is neither builtin, humaneval+, mbpp+ nor a file")
        return load_code_tasks(kind, path), path, kind
    except DatasetError as exc:
        raise click.ClickException(f"suite refused before anything ran: {exc}") from None


def select(tasks: list[Any], spec: str) -> list[Any]:
    """The suite's tasks named by --task-ids, in the order given."""
    if spec.startswith("@"):
        try:
            text = Path(spec[1:]).read_text()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {spec[1:]}: {exc.strerror}", param_hint="--task-ids") from None
        ids = [line.split("#")[0].strip() for line in text.splitlines()]
    else:
        ids = [part.strip() for part in spec.split(",")]
    ids = [i for i in ids if i]
    by_id = {t.task_id: t for t in tasks}
    unknown = [i for i in ids if i not in by_id]
    if unknown or not ids:
        raise click.BadParameter(f"{len(unknown)} ids are not in the suite (e.g. {unknown[0]!r})" if unknown
                                 else "no task ids given", param_hint="--task-ids")
    return [by_id[i] for i in dict.fromkeys(ids)]
