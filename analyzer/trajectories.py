"""What an agent recording holds before anything is graded: sessions, steps per session, tools the
model called, tokens, latency, the models that answered, and how much of the recording replays
covered. `nfanalyze STORE` shows it when the store has no outcome rows (an agent run on its own is
worth looking at before anyone grades it).

Pure: one `Step` per exchange in, a frozen `Summary` out; `logstats.trajectory_steps` reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from noisefloor.display import visible

SHOWN = 10  # tools, models and sessions listed in the text


@dataclass(frozen=True)
class Step:
    """One exchange of a session."""

    exchange_id: int
    session: str
    mode: str  # record / replay / passthrough
    model: str | None = None  # the model that answered (as the answer named it)
    tools: tuple[str, ...] = ()  # tool calls the answer asked for, by function name
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: float | None = None  # recorded: the provider's time to the whole answer
    replay_result: str | None = None  # replay: hit / miss / order_violation
    source_id: int | None = None  # replay hit: the recorded exchange that answered


@dataclass(frozen=True)
class Spread:
    """Min, median, mean and max of a per-session quantity."""

    min: float
    median: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        x = np.asarray(values, dtype=float)
        return cls(float(x.min()), float(np.median(x)), float(x.mean()), float(x.max()))


@dataclass(frozen=True)
class SessionLine:
    session: str
    mode: str
    steps: int
    tools: int
    input_tokens: int
    output_tokens: int
    latency_ms: float
    misses: int


@dataclass(frozen=True)
class Summary:
    sessions: int
    sessions_by_mode: Mapping[str, int]
    exchanges: int
    steps_per_session: Spread | None
    tools: Mapping[str, int]  # tool name -> calls asked for
    input_tokens: int
    output_tokens: int
    latency_ms: Spread | None  # per recorded exchange
    models: Mapping[str, int]  # served model -> exchanges
    replayed_exchanges: int
    hits: int
    misses: int
    order_violations: int
    recorded_exchanges: int
    recorded_covered: int  # recorded exchanges a replay hit served at least once
    replay_sessions_exact: int  # replay sessions with every request a hit
    replay_sessions: int
    per_session: tuple[SessionLine, ...] = field(default_factory=tuple)

    @property
    def coverage(self) -> float | None:
        return self.recorded_covered / self.recorded_exchanges if self.replayed_exchanges and self.recorded_exchanges \
            else None

    def to_json(self) -> dict[str, Any]:
        def spread(s: Spread | None) -> dict[str, float] | None:
            return None if s is None else {"min": s.min, "median": s.median, "mean": s.mean, "max": s.max}

        return {"sessions": self.sessions, "sessions_by_mode": dict(self.sessions_by_mode),
                "exchanges": self.exchanges, "steps_per_session": spread(self.steps_per_session),
                "tools": dict(self.tools), "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "latency_ms": spread(self.latency_ms), "models": dict(self.models),
                "replay": {"exchanges": self.replayed_exchanges, "hits": self.hits, "misses": self.misses,
                           "order_violations": self.order_violations, "sessions": self.replay_sessions,
                           "sessions_exact": self.replay_sessions_exact,
                           "recorded_exchanges": self.recorded_exchanges, "recorded_covered": self.recorded_covered,
                           "coverage": self.coverage},
                "per_session": [vars(s) for s in self.per_session]}


def summarize(steps: Iterable[Step]) -> Summary:
    by_session: dict[str, list[Step]] = {}
    for s in steps:
        by_session.setdefault(s.session, []).append(s)
    every = [s for v in by_session.values() for s in v]
    modes = Counter(v[0].mode for v in by_session.values())
    tools = Counter(t for s in every for t in s.tools)
    models = Counter(s.model for s in every if s.model)
    recorded = {s.exchange_id for s in every if s.mode == "record"}
    replayed = [s for s in every if s.mode == "replay"]
    covered = {s.source_id for s in replayed if s.replay_result == "hit" and s.source_id in recorded}
    replay_sessions = [v for v in by_session.values() if v[0].mode == "replay"]
    lines = tuple(SessionLine(name, v[0].mode, len(v), sum(len(s.tools) for s in v),
                              sum(s.input_tokens or 0 for s in v), sum(s.output_tokens or 0 for s in v),
                              round(sum(s.latency_ms or 0.0 for s in v), 3),
                              sum(s.replay_result not in (None, "hit") for s in v))
                  for name, v in by_session.items())
    return Summary(
        sessions=len(by_session), sessions_by_mode=dict(sorted(modes.items())), exchanges=len(every),
        steps_per_session=Spread.of([len(v) for v in by_session.values()]),
        tools=dict(tools.most_common()), input_tokens=sum(s.input_tokens or 0 for s in every),
        output_tokens=sum(s.output_tokens or 0 for s in every),
        latency_ms=Spread.of([s.latency_ms for s in every if s.mode == "record" and s.latency_ms is not None]),
        models=dict(models.most_common()), replayed_exchanges=len(replayed),
        hits=sum(s.replay_result == "hit" for s in replayed), misses=sum(s.replay_result == "miss" for s in replayed),
        order_violations=sum(s.replay_result == "order_violation" for s in replayed),
        recorded_exchanges=len(recorded), recorded_covered=len(covered),
        replay_sessions_exact=sum(all(s.replay_result == "hit" for s in v) for v in replay_sessions),
        replay_sessions=len(replay_sessions), per_session=lines)


def tools_in(doc: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The function names a response asks to call: OpenAI chat `tool_calls`, Responses
    `function_call` items, Anthropic `tool_use` blocks, Gemini `functionCall` parts."""
    if not isinstance(doc, Mapping):
        return ()
    names: list[Any] = []
    for choice in _list(doc.get("choices")):
        for call in _list(_dict(_dict(choice).get("message")).get("tool_calls")):
            names.append(_dict(_dict(call).get("function")).get("name"))
    for item in _list(doc.get("output")):
        if _dict(item).get("type") == "function_call":
            names.append(_dict(item).get("name"))
    for block in _list(doc.get("content")):
        if _dict(block).get("type") == "tool_use":
            names.append(_dict(block).get("name"))
    for cand in _list(doc.get("candidates")):
        for part in _list(_dict(_dict(cand).get("content")).get("parts")):
            names.append(_dict(_dict(part).get("functionCall")).get("name"))
    return tuple(str(n) for n in names if isinstance(n, str) and n)


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _dict(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _spread(s: Spread | None, unit: str = "") -> str:
    return "-" if s is None else f"median {s.median:g}{unit} (min {s.min:g}, mean {s.mean:.4g}, max {s.max:g})"


def text(summary: Summary, where: str) -> str:
    """The summary as the terminal shows it; labels from the store escaped."""
    s = summary
    modes = ", ".join(f"{n} {visible(m)}" for m, n in s.sessions_by_mode.items()) or "none"
    lines = [f"Trajectories in {visible(where)} (no graded outcome rows: grade them with nfverify for statistics)",
             f"sessions: {s.sessions} ({modes}); exchanges: {s.exchanges}",
             f"steps per session: {_spread(s.steps_per_session)}",
             "tools called: " + (", ".join(f"{visible(t)} x{n}" for t, n in list(s.tools.items())[:SHOWN]) or "none")
             + (f" (+{len(s.tools) - SHOWN} more)" if len(s.tools) > SHOWN else ""),
             f"tokens: {s.input_tokens} in, {s.output_tokens} out",
             f"latency per recorded exchange: {_spread(s.latency_ms, ' ms')}",
             "models served: " + (", ".join(f"{visible(m)} ({n})" for m, n in list(s.models.items())[:SHOWN]) or "-")]
    if s.replayed_exchanges:
        cov = s.coverage
        lines.append(f"replay: {s.hits} hits, {s.misses} misses, {s.order_violations} order violations in "
                     f"{s.replayed_exchanges} replayed exchanges; {s.replay_sessions_exact} of {s.replay_sessions} "
                     f"replay sessions exact; {s.recorded_covered} of {s.recorded_exchanges} recorded exchanges "
                     f"served" + (f" ({cov:.0%})" if cov is not None else ""))
    else:
        lines.append("replay: none")
    lines.append("session            mode     steps  tools  tokens in/out  latency ms  misses")
    for x in s.per_session[:SHOWN]:
        lines.append(f"{visible(x.session)[:18]:<18} {visible(x.mode):<8} {x.steps:>5}  {x.tools:>5}  "
                     f"{x.input_tokens:>6}/{x.output_tokens:<6} {x.latency_ms:>10.1f}  {x.misses:>6}")
    if len(s.per_session) > SHOWN:
        lines.append(f"... {len(s.per_session) - SHOWN} more sessions (--json lists every one)")
    return "\n".join(lines)
