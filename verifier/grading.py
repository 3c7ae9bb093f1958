"""The one way code candidates are graded: nfverify and nfladder both build their grader here,
with the same options, so a verdict never depends on which command asked for it."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from noisefloor._cli import options
from noisefloor.verifier.datasets import DEFAULT_MAX_INPUTS, load_code_tasks, sha256_file
from noisefloor.verifier.differential import Differential
from noisefloor.verifier.isolation import Limits
from noisefloor.verifier.sandbox import Sandbox

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class GradeOptions:
    jobs: int = os.cpu_count() or 1
    max_inputs: int = DEFAULT_MAX_INPUTS  # inputs per task: base first, then plus
    timeout: int = 10  # CPU seconds per candidate (raised to 4x the canonical solution's need)
    memory_mb: int = 2048
    isolation: str | None = None  # None: namespaces as root, process otherwise

    def limits(self) -> Limits:
        return Limits(cpu_s=self.timeout, memory_mb=self.memory_mb)


def code_grader(kind: str, dataset: Path, options: GradeOptions, task_ids: Collection[str] | None = None) -> Differential:
    """A differential grader for `kind` (humaneval+ / mbpp+) on `dataset`, limited to `task_ids`."""
    tasks = load_code_tasks(kind, dataset, options.max_inputs)
    if task_ids is not None:
        tasks = [t for t in tasks if t.task_id in task_ids]
    sandbox = Sandbox(options.jobs, options.limits(), options.isolation)
    return Differential(tasks, sandbox, sha256_file(dataset), options.max_inputs)


def grade_options(f: F) -> F:
    """The grading options, declared once for every command that grades."""
    d = GradeOptions()
    opts = [
        click.option("--max-inputs", default=d.max_inputs, show_default=True, type=click.IntRange(min=1),
                     help="Inputs per task: base first, then plus."),
        click.option("--timeout", default=d.timeout, show_default=True, type=click.IntRange(min=1),
                     help="CPU seconds per candidate (at least 4x what the canonical solution needed)."),
        click.option("--memory-mb", default=d.memory_mb, show_default=True, type=click.IntRange(min=64)),
        click.option("--isolation", type=click.Choice(["namespaces", "process"]), default=None,
                     help="Sandbox isolation (default: namespaces as root, which fails closed; process otherwise)."),
    ]
    return options(*opts)(f)
