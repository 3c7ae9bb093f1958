"""The typed condition and its registry: the one place that says what a condition is.

A condition tells the proxy how to treat its runs (record, or strict replay from a recorded
source), which request fields the proxy imposes (typed overrides such as `/temperature`), which
prompt perturbation it applies, how many replicates it runs, what stamp its rows carry and where
it sits in a report. The runner, both executors, the report and the built-in provider all read
conditions through a `Registry`; no component compares condition names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from noisefloor.errors import InputError

ROLES = ("generation", "judge")
TREATMENTS = ("record", "replay")
STAMPED = ("/model", "/temperature", "/top_p", "/seed")  # overrides that are part of the stamp


class ConditionError(InputError):
    """A condition or design that cannot run as declared; the message names the field."""


@dataclass(frozen=True)
class Override:
    """One request field the proxy sets before keying and forwarding (`nfproxy --set`)."""

    pointer: str
    value: Any

    def arg(self) -> list[str]:
        return ["--set", f"{self.pointer}={json.dumps(self.value)}"]


@dataclass(frozen=True)
class Stamp:
    """What makes two runs comparable: model as requested, sampling, grader or judge version."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    grader_version: str | None = None


@dataclass(frozen=True)
class Condition:
    name: str
    role: str = "generation"  # generation: the agent's own answers; judge: verdicts on frozen candidates
    proxy: str = "record"  # record, or replay (strict, never upstream)
    replay_from: tuple[str, int] | None = None  # replay: (source condition, replicate) whose recording answers
    overrides: tuple[Override, ...] = ()
    variant: str | None = None  # perturbation variant the proxy applies to the last user turn
    replicates: int | None = None  # None: the design's default
    rank: int = 0  # order in reports
    env: tuple[tuple[str, str], ...] = ()  # extra agent environment (a candidate agent, an injected fault)
    agent: tuple[str, ...] | None = None  # this condition's own agent argv (None: the study's)
    endpoint: str | None = None  # audit: the endpoint (arm group) the rows belong to
    grader_version: str | None = None  # set by the design (grader or judge version)
    replay_each: bool = False  # replay: replicate r answers from the source's replicate r (compare: B against each A)

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in ",=/ "):
            raise ConditionError(f"condition name {self.name!r} must be non-empty, without ',', '=', '/' or spaces")
        if self.role not in ROLES:
            raise ConditionError(f"condition {self.name!r}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.proxy not in TREATMENTS:
            raise ConditionError(f"condition {self.name!r}: proxy {self.proxy!r} is not record or replay")
        if (self.proxy == "replay") != (self.replay_from is not None):
            raise ConditionError(f"condition {self.name!r}: a replay condition needs replay_from (CONDITION, "
                                 "REPLICATE) and a recording one must not have it")
        if self.replicates is not None and self.replicates < 1:
            raise ConditionError(f"condition {self.name!r}: replicates must be at least 1")

    @property
    def replays(self) -> bool:
        return self.proxy == "replay"

    def override(self, pointer: str) -> Any:
        return next((o.value for o in self.overrides if o.pointer == pointer), None)

    @property
    def stamp(self) -> Stamp:
        """The stamp the condition itself imposes (the rest comes from the recorded request)."""
        t, p, s = self.override("/temperature"), self.override("/top_p"), self.override("/seed")
        m = self.override("/model")
        return Stamp(str(m) if m is not None else None, float(t) if t is not None else None,
                     float(p) if p is not None else None, int(s) if s is not None else None, self.grader_version)

    def with_replicates(self, n: int) -> Condition:
        return replace(self, replicates=n)


@dataclass(frozen=True)
class Registry:
    """The study's conditions, in report order; the one lookup every part uses."""

    conditions: tuple[Condition, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [c.name for c in self.conditions]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ConditionError(f"condition {dup!r} is declared twice; give each condition its own name")
        for c in self.conditions:
            if c.replay_from is not None:
                src = self.get(c.replay_from[0])
                if src is None or src.replays:
                    raise ConditionError(f"condition {c.name!r} replays {c.replay_from[0]!r}, which is not a "
                                         "recorded condition of this study; declare it (before the replay)")
        object.__setattr__(self, "conditions", tuple(sorted(self.conditions, key=lambda c: c.rank)))

    def __iter__(self) -> Iterator[Condition]:
        return iter(self.conditions)

    def __len__(self) -> int:
        return len(self.conditions)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.conditions)

    def get(self, name: str) -> Condition | None:
        return next((c for c in self.conditions if c.name == name), None)

    def __getitem__(self, name: str) -> Condition:
        c = self.get(name)
        if c is None:
            raise ConditionError(f"unknown condition {name!r}; this study has {', '.join(self.names)}")
        return c

    def select(self, names: Iterable[str]) -> Registry:
        wanted = list(names)
        for n in wanted:
            self[n]
        return Registry(tuple(c for c in self.conditions if c.name in wanted))

    def of_role(self, role: str) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if c.role == role)

    def keying(self, c: Condition) -> Condition:
        """The condition whose overrides key a replay's requests: its recorded source's."""
        return self[c.replay_from[0]] if c.replay_from else c

    def proxy_args(self, c: Condition, upstream: str, perturb_file: str | None = None) -> list[str]:
        """nfproxy's arguments for the condition (without a store)."""
        source = self.keying(c)  # a replay keys its requests as its source keyed them
        own = tuple(o for o in c.overrides if c is not source)  # and a compare's candidate changes them its way
        overrides = [o for o in source.overrides if o.pointer not in {x.pointer for x in own}] + list(own)
        args = ["--upstream", upstream, "--condition", c.name, "-q",
                *(["--mode", "replay", "--strict", "--replay-log-in-store"] if c.replays else ["--mode", "record"]),
                *(a for o in overrides for a in o.arg())]
        if source.variant:
            args += ["--perturb", source.variant, *(["--perturb-file", perturb_file] if perturb_file else [])]
        return args

    def stamp(self, c: Condition) -> Stamp:
        return self.keying(c).stamp if c.replays else c.stamp

    def to_json(self) -> list[dict[str, Any]]:
        out = []
        for c in self.conditions:
            out.append({"name": c.name, "role": c.role, "proxy": c.proxy,
                        "replay_from": list(c.replay_from) if c.replay_from else None,
                        "overrides": {o.pointer: o.value for o in c.overrides}, "variant": c.variant,
                        "replicates": c.replicates, "rank": c.rank, "endpoint": c.endpoint})
        return out


def parse_overrides(spec: Mapping[str, Any] | None, where: str) -> tuple[Override, ...]:
    """Overrides from a study file's table: {"/temperature" = 0, "/seed" = 7}."""
    out = []
    for pointer, value in (spec or {}).items():
        if not isinstance(pointer, str) or not pointer.startswith("/"):
            raise ConditionError(f"{where}: override {pointer!r} is not a JSON pointer such as /temperature")
        out.append(Override(pointer, value))
    return tuple(out)


# -- the ladder's conditions: every rung a ladder can run, the one place a new one is declared ------

LADDER_DEFAULT = ("live", "t0", "replay")  # the determinism ladder's three rungs, in order
PINNED_SEED = 1234  # the sampling seed `seed-pinned` fixes
LIVE_TEMPERATURE = 0.7


def ladder_conditions(replay_source: tuple[str, int] = ("t0", 0), grader: str | None = None) -> tuple[Condition, ...]:
    """Every condition `--conditions` can pick for a ladder, in report order: live at the agent's own
    sampling; seed-pinned at T=0.7 with a fixed sampling seed (does the provider honour a seed?);
    t0 with the proxy imposing temperature 0; replay answering strictly from one recorded replicate."""
    return (
        Condition("live", rank=0, grader_version=grader),
        Condition("seed-pinned", overrides=(Override("/temperature", LIVE_TEMPERATURE), Override("/seed", PINNED_SEED)),
                  rank=1, grader_version=grader),
        Condition("t0", overrides=(Override("/temperature", 0),), rank=2, grader_version=grader),
        Condition("replay", proxy="replay", replay_from=replay_source, rank=3, grader_version=grader),
    )


LADDER_NAMES = tuple(c.name for c in ladder_conditions())
RECORDED = tuple(c.name for c in ladder_conditions() if not c.replays)  # what a replay can serve from
