"""nfladder's progress: counts, rate and ETA as runs finish, and a resume that says what an earlier
run of the same command did (a stub executor stands in for the agent runs; the runner is real)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from types import SimpleNamespace

from noisefloor.ladder import designs
from noisefloor.ladder.agent_run import Attempt
from noisefloor.ladder.runner import Config, Ladder, _Progress


class Finishing:
    """Reports every run as finished at once (returncode 1 for task T1)."""

    def run(self, runs, args, store, finished, replay=False):  # type: ignore[no-untyped-def]
        self.asked = [r.task_id for r in runs]
        for r in runs:
            finished(Attempt(f"{r.condition}-r{r.replicate}-{r.task_id}", r.task_id, r.condition, r.replicate,
                             1 if r.task_id == "T1" else 0, False, 0.1))
        return 0


def test_progress_counts_and_shows_an_eta_only_once_runs_give_a_rate(monkeypatch):
    """A slow start (imports, the proxy, the first connection) is no rate: the ETA waits for
    `RATE_RUNS` runs and is measured from the first one on."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    p = _Progress(20, every=0.0)
    lines = []
    for n in range(8):
        now[0] += 60.0 if n == 0 else 1.0  # a minute to the first run, then one a second
        lines.append(p.step(n == 2))
    assert lines[0] == "1/20 runs (5%), 0.02 runs/s, 1m00s so far", lines[0]
    assert all("ETA" not in line for line in lines[:_Progress.RATE_RUNS - 1]), lines
    assert lines[4].endswith(", ETA 15s"), lines[4]  # 15 left at one a second, not at 5 per 64 s
    assert lines[7].startswith("8/20 runs (40%), 1 failed,") and lines[7].endswith("ETA 12s"), lines[7]
    for _ in range(12):
        last = p.step(False)
    assert last.startswith("20/20 runs (100%), 1 failed,") and "ETA" not in last


def test_resume_says_what_was_done_before(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    tasks = [SimpleNamespace(task_id=f"T{i}", prompt="p", entry_point="f") for i in range(3)]
    earlier = [Attempt(f"replay-r0-T{i}", f"T{i}", "replay", 0, 1 if i == 1 else 0, False, 0.2) for i in (0, 1)]
    (out / "attempts.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in earlier))
    said: list[str] = []
    executor = Finishing()
    cfg = Config(out=out, agent=["agent", "{task_file}"], tasks=tasks, dataset=tmp_path / "d.jsonl",
                 upstream="http://127.0.0.1:9", replicates=2, conditions=designs.ladder(2).conditions)
    replay = cfg.conditions["replay"]
    Ladder(cfg, said.append, executor).run_condition(replay)
    assert said[0] == "[replay] resuming: 2 of 6 runs done earlier (1 of them failed); 4 to run"
    assert executor.asked == ["T2", "T0", "T1", "T2"]
    assert any(line.startswith("[replay] replicate 2/2 done: 4/4 runs (100%), 1 failed,") for line in said), said
    said.clear()
    Ladder(cfg, said.append, executor).run_condition(replay)
    assert said == ["[replay] all 6 runs done earlier"]
