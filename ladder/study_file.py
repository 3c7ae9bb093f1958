"""Study files: a design declared in TOML (`nfladder run STUDY.toml`), so a study can be kept,
reviewed and rerun as a file. Top-level keys are `nfladder run`'s options (dashes or
underscores); a ladder study may declare its own conditions as `[[condition]]` tables:

    design = "ladder"
    agent = "python agent.py {task_file}"
    replicates = 5
    [[condition]]
    name = "t0-seeded"
    overrides = { "/temperature" = 0, "/seed" = 7 }
    [[condition]]
    name = "replay"
    proxy = "replay"
    replay_from = ["t0-seeded", 0]

Options given on the command line win over the file's. The files a study reads (samples,
perturb-file, bfcl) are relative to the study file's own folder, so a study folder can move whole.
What it writes (`out`) is relative to the current folder, like `--out`, so running a study kept
in a repository writes nothing into the repository; `out = "{study_dir}/nf-ladder"` puts the
outputs beside the study file instead.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

from noisefloor.ladder.conditions import Condition, ConditionError, Registry, parse_overrides

RENAMED = {"agent": "agent_cmd", "tasks": "limit", "k": "gate_k", "bfcl": "bfcl_dir"}
INPUT_PATHS = ("samples", "perturb_file", "bfcl_dir")
STUDY_DIR = "{study_dir}"
CONDITION_KEYS = {"name", "role", "proxy", "replay_from", "overrides", "variant", "replicates", "rank", "env",
                  "endpoint", "agent"}


def load(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise click.ClickException(f"cannot read study file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"study file {path} is not valid TOML ({exc}); fix it and rerun") from None


def merge(path: Path, params: dict[str, Any], ctx: click.Context) -> dict[str, Any]:
    """The command's parameters with the file's values wherever the command line left the default."""
    doc = load(path)
    out = dict(params)
    conditions = doc.pop("condition", None)
    for raw, value in doc.items():
        key = RENAMED.get(raw.replace("-", "_"), raw.replace("-", "_"))
        if key not in params or key == "study":
            raise click.ClickException(f"study file {path}: unknown key {raw!r}; keys are nfladder run's options "
                                       f"({', '.join(sorted(k for k in params if k != 'study'))}) and [[condition]]")
        if ctx.get_parameter_source(key) not in (None, click.core.ParameterSource.DEFAULT):
            continue  # the command line wins
        if key in INPUT_PATHS and isinstance(value, str):
            value = (path.parent / value) if not Path(value).is_absolute() else Path(value)
        elif key == "out" and isinstance(value, str):
            value = out_path(value, path)
        elif key in ("candidate_env", "candidate_set") and isinstance(value, dict):
            value = tuple(f"{k}={v}" for k, v in value.items())
        elif key in ("conditions", "variants", "categories", "judge_temperatures") and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        out[key] = value
    if conditions is not None:
        out["custom_conditions"] = conditions_of(conditions, path)
    return out


def out_path(value: str, study: Path) -> Path:
    """A study's `out`: relative to the current folder; a leading `{study_dir}` names the study file's folder."""
    if value == STUDY_DIR or value.startswith(STUDY_DIR + "/"):
        return study.parent / value[len(STUDY_DIR) + 1:] if value != STUDY_DIR else study.parent
    if STUDY_DIR in value:
        raise click.ClickException(f"study file {study}: out = {value!r}: {STUDY_DIR} may only start the path "
                                   f"(out = \"{STUDY_DIR}/nf-out\")")
    return Path(value)


def conditions_of(tables: Any, path: Path) -> Registry:
    if not isinstance(tables, list) or not tables:
        raise click.ClickException(f"study file {path}: [[condition]] must be a list of tables")
    conds = []
    for i, t in enumerate(tables, 1):
        where = f"study file {path}, condition {i}"
        if not isinstance(t, dict):
            raise click.ClickException(f"{where}: not a table")
        unknown = sorted(set(t) - CONDITION_KEYS)
        if unknown:
            raise click.ClickException(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(CONDITION_KEYS))})")
        try:
            src = t.get("replay_from")
            conds.append(Condition(
                name=str(t.get("name", "")), role=t.get("role", "generation"), proxy=t.get("proxy", "record"),
                replay_from=(str(src[0]), int(src[1])) if src else None,
                overrides=parse_overrides(t.get("overrides"), where), variant=t.get("variant"),
                replicates=t.get("replicates"), rank=int(t.get("rank", i)),
                env=tuple(sorted((str(k), str(v)) for k, v in (t.get("env") or {}).items())),
                endpoint=t.get("endpoint"), agent=tuple(t["agent"]) if t.get("agent") else None))
        except (ConditionError, TypeError, ValueError, IndexError) as exc:
            raise click.ClickException(f"{where}: {exc}") from None
    try:
        return Registry(tuple(conds))
    except ConditionError as exc:
        raise click.ClickException(f"study file {path}: {exc}") from None
