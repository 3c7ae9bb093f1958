"""Recordings as test fixtures: `@pytest.mark.nfproxy(upstream=URL)` (or the `nfproxy` fixture)
puts an nfproxy in front of the test, sets the SDK base-URL variables for its duration, and keeps
one recording per test under `recordings/` beside the test file.

`--nf-record-mode` has pytest-recording's meanings:
  none          strict replay only, never upstream; no recording is an error (the default)
  once          record when the test has no recording yet, else as `none`
  new_episodes  replay what is recorded, send what is new upstream and add it to the recording
  all           record everything again, replacing the recording

Replay runs on a temporary copy, so the recording's files are never opened for writing: a test
that passes offline leaves them byte-identical. A miss fails the test, with the nearest recorded
request and the diff of the two in pytest's report. Each test gets its own proxies on port 0 and
its own temporary folders, so the plugin works under pytest-xdist.

Tests may share one recording (`recording=PATH` on several markers), also across xdist workers:
in the record modes, every read and write of a recording holds the lock of the folder it is in
(`file_lock`; no file is added there), and a save adds what the test recorded to the recording as
it is NOW (not as it was when the test began), written whole beside it and renamed into place.
Under `all`, the first save of a run replaces what earlier runs recorded and the later saves of
the same run add to it: a recording keeps the id of the run that wrote it (store meta
`pytest_run`; xdist's workers share their controller's id). In `none` mode no lock is taken.

Loaded by every pytest run where noisefloor is installed (a `pytest11` entry point): it imports
nothing heavy until a test asks for a proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy
import pytest

from noisefloor.errors import NoisefloorError

MODES = ("none", "once", "new_episodes", "all")
MARKER = "nfproxy"
_STASH: pytest.StashKey[Any] = pytest.StashKey()
_RUN_ID: pytest.StashKey[str] = pytest.StashKey()
SAVE_WAIT = 600.0  # seconds a save waits for another worker's save into the same folder
RUN_META = "pytest_run"  # the store meta key holding the id of the run that wrote a recording


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("noisefloor", "noisefloor recordings (nfproxy)")
    group.addoption("--nf-record-mode", choices=MODES, default=None,
                    help="none (default): strict replay, never upstream; once: record a test without a recording; "
                         "new_episodes: record only what the recording lacks; all: record everything again")
    group.addoption("--nf-recordings-dir", default=None,
                    help="Folder of recordings, relative to each test file (default: recordings).")
    parser.addini("nf_record_mode", "default --nf-record-mode", default="none")
    parser.addini("nf_recordings_dir", "default --nf-recordings-dir", default="recordings")
    parser.addini("nf_upstream", "upstream of tests whose marker names none (the fixture form)", default="")


def pytest_configure(config: pytest.Config) -> None:
    # one id for the whole run: xdist's workers share the controller's, a plain run makes its own
    config.stash[_RUN_ID] = str(getattr(config, "workerinput", {}).get("testrunuid") or uuid.uuid4().hex)
    config.addinivalue_line(
        "markers", "nfproxy(upstream=URL, recording=PATH, record_mode=MODE, args=()): run the test behind an "
                   "nfproxy that records to or strictly replays from its own recording (see --nf-record-mode)")


@dataclass(frozen=True)
class NfProxy:
    """What a test behind nfproxy gets: the proxy's URL, the environment set for the test, the
    recording's path, the record mode and what the proxy does in it (replay, record, new_episodes)."""

    url: str
    env: dict[str, str]
    recording: Path
    record_mode: str
    proxy_mode: str


@dataclass
class _Run:
    """The processes behind one test, and how to finish it."""

    recording: Path
    record_mode: str
    proxy_mode: str
    work: Path
    run_id: str = ""
    replay: Any = None  # RunningProxy
    record: Any = None
    front: Any = None  # Episodes
    misses: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    finished: bool = False

    def finish(self) -> None:
        """Stop the proxies; read the replay's misses; write the recording (record modes)."""
        if self.finished:
            return
        self.finished = True
        if self.front is not None:
            self.front.stop()
        if self.replay is not None:
            code = self.replay.stop()
            self.misses = _misses(self.work / "replay.lmdb")
            if code not in (0, 3) or (code == 3 and not self.misses and self.proxy_mode == "replay"):
                self.problems.append(f"the replaying nfproxy exited with status {code}: {self.replay.output[-2000:]}")
        if self.record is not None:
            code = self.record.stop()
            if code != 0:
                self.problems.append(f"the recording nfproxy exited with status {code} (the recording was not "
                                     f"changed): {self.record.output[-2000:]}")
                return
            from noisefloor.errors import NoisefloorError

            try:
                _save(self)
            except NoisefloorError as exc:  # a lock another process never gave up: one line, not a traceback
                self.problems.append(f"the recording was not changed: {exc}")


def _mode(config: pytest.Config, marker: pytest.Mark | None) -> str:
    mode = (marker.kwargs.get("record_mode") if marker else None) or config.getoption("--nf-record-mode") \
        or config.getini("nf_record_mode") or "none"
    if mode not in MODES:
        raise pytest.UsageError(f"nf record mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def _recording(request: pytest.FixtureRequest, marker: pytest.Mark | None) -> Path:
    given = marker.kwargs.get("recording") if marker else None
    here = Path(request.node.path).parent
    if given:
        return here / given
    folder = request.config.getoption("--nf-recordings-dir") or request.config.getini("nf_recordings_dir")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_") or "test"
    return here / folder / Path(request.node.path).stem / f"{name}.lmdb"


def _environment(url: str) -> dict[str, str]:
    from noisefloor.proxy.providers import sdk_env  # each provider module names its SDKs' variables

    return {"NFPROXY_URL": url, **sdk_env(url)}


@pytest.fixture
def nfproxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfProxy]:
    """An nfproxy for this test (settings from the `nfproxy` marker); the SDK base-URL variables
    point at it until the test ends."""
    from noisefloor.proxy.launch import start

    marker = request.node.get_closest_marker(MARKER)
    kwargs = dict(marker.kwargs) if marker else {}
    mode = _mode(request.config, marker)
    recording = _recording(request, marker)
    extra = [str(a) for a in kwargs.get("args", ())]
    upstream = (kwargs.get("upstream") or (marker.args[0] if marker and marker.args else None)
                or request.config.getini("nf_upstream") or None)
    work = tmp_path_factory.mktemp("nfproxy")
    replay_copy = work / "replay.lmdb"
    try:  # `all` replays nothing: it records every request again
        have = mode != "all" and _copy_for_replay(recording, replay_copy, locked=mode != "none")
    except NoisefloorError as exc:  # another worker's save never let go of the folder: one line
        pytest.fail(str(exc), pytrace=False)
    # one CA per pytest process (each xdist worker has its own base folder): made by the first
    # proxy, only read by the rest, so no test pays for generating a key again
    ca = tmp_path_factory.getbasetemp() / "nfproxy-ca"

    if mode == "none" and not have:
        pytest.fail(f"no nfproxy recording at {recording}; record it once with --nf-record-mode=once "
                    "(it needs the upstream)", pytrace=False)
    replaying = have and mode in ("none", "once", "new_episodes")
    recording_too = mode in ("all", "new_episodes") or not have
    if recording_too and not upstream:
        pytest.fail(f"--nf-record-mode={mode} needs the upstream: @pytest.mark.nfproxy(upstream=URL) "
                    "or nf_upstream in the ini file", pytrace=False)
    proxy_mode = "new_episodes" if replaying and recording_too else ("replay" if replaying else "record")
    run = _Run(recording, mode, proxy_mode, work, request.config.stash[_RUN_ID])
    request.node.stash[_STASH] = run
    try:
        if replaying:  # replay's own log goes to the copy
            run.replay = start("--mode", "replay", "--strict", "--replay-log-in-store", "--store", str(replay_copy),
                              "--confdir", str(ca), *extra)
        if recording_too:
            run.record = start("--mode", "record", "--upstream", str(upstream), "--store", str(work / "record.lmdb"),
                               "--confdir", str(ca), *extra)
        if run.replay is not None and run.record is not None:
            from noisefloor.proxy.record.episodes import Episodes

            run.front = Episodes(run.replay.url, run.record.url)
            url = run.front.start()
        else:
            url = (run.replay or run.record).url
    except BaseException:
        run.finish()
        raise
    env = _environment(url)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        try:
            yield NfProxy(url, env, recording, mode, proxy_mode)
        finally:
            run.finish()
    if run.problems:
        pytest.fail("; ".join(run.problems), pytrace=False)


@pytest.fixture(autouse=True)
def _nfproxy_marked(request: pytest.FixtureRequest) -> None:
    """A test with the marker gets the proxy without naming the fixture."""
    if request.node.get_closest_marker(MARKER) is not None and "nfproxy" not in request.fixturenames:
        request.getfixturevalue("nfproxy")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    run = item.stash.get(_STASH, None)
    if run is None or call.when != "call":
        return
    run.finish()  # the test body is done: its misses are all in the replay's log now
    if not run.misses or run.proxy_mode != "replay":  # under new_episodes a miss went upstream
        return
    report = outcome.get_result()
    text = (f"nfproxy strict replay missed ({len(run.misses)}; recording {run.recording}, record mode "
            f"{run.record_mode}):\n" + "\n".join(run.misses) +
            "\nrecord what changed with --nf-record-mode=new_episodes (or all)")
    if report.outcome != "failed":
        report.outcome = "failed"  # the test caught the error itself: the miss still fails it
        report.longrepr = text
    else:
        report.longrepr = f"{report.longrepr}\n\n{text}"


def _misses(store_path: Path) -> list[str]:
    """Each miss (and call-order violation) of a replay: the request, the nearest recorded one, the diff."""
    from noisefloor.proxy.store.log import Store, StoreError

    out: list[str] = []
    try:
        with Store.open(store_path, write=False) as store:
            for ex in store.exchanges():
                if ex.mode != "replay" or ex.replay_result not in ("miss", "order_violation"):
                    continue
                try:
                    doc = json.loads(store.bodies.decoded(ex.response) or b"{}") if ex.response else {}
                except ValueError:
                    doc = {}
                err = doc.get("error") or {}
                lines = [f"  {ex.request['method']} {ex.request['url']}: {err.get('message') or ex.replay_result}"]
                near = err.get("nearest")
                if near:
                    lines.append(f"  nearest recorded request: exchange {near.get('exchange_id')} (session "
                                 f"{near.get('session')}, similarity {near.get('similarity')})")
                    lines += [f"    {line}" for line in near.get("diff") or []]
                elif ex.replay_result == "order_violation":
                    lines.append(f"    {(ex.replay or {}).get('detail')}")
                out.append("\n".join(lines))
    except StoreError as exc:
        out.append(f"  the replay's log could not be read: {exc}")
    return out


def _aside(recording: Path, what: str) -> Path:
    return recording.with_name(f"{recording.name}.{what}")


def _recover(recording: Path) -> None:
    """Finish a save that stopped between its two renames (the recording moved aside, the new one
    not yet in place): the moved-aside recording goes back. Called holding the lock."""
    old = _aside(recording, "old")
    if old.is_dir() and not recording.exists():
        os.replace(old, recording)


def _copy_for_replay(recording: Path, copy: Path, *, locked: bool) -> bool:
    """Copy the recording for a replay (when there is one); whether there was. In the record modes
    the copy holds the recording's lock, so it never reads one that another worker is swapping."""
    if not locked or not recording.parent.is_dir():
        have = (recording / "data.mdb").is_file()
        if have:
            shutil.copytree(recording, copy)
        return have
    from noisefloor.file_lock import held

    with held(recording.parent, timeout=SAVE_WAIT):
        _recover(recording)
        have = (recording / "data.mdb").is_file()
        if have:
            shutil.copytree(recording, copy)
    return have


def _save(run: _Run) -> None:
    """Add what the test recorded to the recording as it is now (or, the first save of an `all`
    run, replace it), holding the lock of its folder: written whole beside the old one (compact,
    only used pages) and renamed into place."""
    from noisefloor.file_lock import held
    from noisefloor.proxy.store.log import Store

    recorded = run.work / "record.lmdb"
    with Store.open(recorded, write=True) as store:
        empty = len(store) == 0
        store.set_meta(RUN_META, run.run_id)
    run.recording.parent.mkdir(parents=True, exist_ok=True)
    with held(run.recording.parent, timeout=SAVE_WAIT):
        _recover(run.recording)
        pristine = None
        if (run.recording / "data.mdb").is_file():
            pristine = run.work / "pristine.lmdb"  # read as a copy: the recording is never opened
            shutil.rmtree(pristine, ignore_errors=True)
            shutil.copytree(run.recording, pristine)
            if run.record_mode == "all":  # `all` replaces what earlier runs recorded, once
                with Store.open(pristine, write=False) as store:
                    pristine = pristine if store.meta(RUN_META) == run.run_id else None
        if empty and pristine is not None:
            return  # nothing new: the recording stays as it was, byte for byte
        _write(run, recorded, pristine)


def _write(run: _Run, recorded: Path, pristine: Path | None) -> None:
    """The recording made from `recorded` (merged after `pristine`, a copy of the recording as it
    is, when given), written beside it and swapped in. Called holding the lock of its folder."""
    from noisefloor.proxy.store.log import Store
    from noisefloor.proxy.store.merge.run import merge

    source = recorded
    if pristine is not None:
        source = run.work / "merged.lmdb"
        shutil.rmtree(source, ignore_errors=True)
        merge(source, [pristine, recorded], lambda s: None)
        with Store.open(source, write=True) as store:
            store.set_meta(RUN_META, run.run_id)
    fresh = _aside(run.recording, "new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    with Store.open(source, write=False) as store:
        store.tables.copy_to(fresh)
    old = _aside(run.recording, "old")
    if run.recording.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(run.recording, old)
    os.replace(fresh, run.recording)
    shutil.rmtree(old, ignore_errors=True)
