"""nfview in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium):
the pages render from a real recording and a replay with a miss, the filters narrow the lists, a
report row leads to its sessions, recorded markup never runs, and the folder is byte-identical
afterwards.

NF_SCREENSHOTS=FOLDER keeps a screenshot of each main page (docs/ holds the ones README shows).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import Store
from noisefloor.viewer import pages
from tests import loopback
from tests.conftest import ROOT, start_nfproxy
from tests.fake_upstream import FakeUpstream

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# planted in a task id, a condition name, a request body and a response body: none may ever run
TASK = 'T1<img src=x onerror="window.__nfpwned=1">'
BODY = '<script>window.__nfpwned=2</script><img src=y onerror="window.__nfpwned=3">'
ANSWER = 'def f():\n    return "<img src=z onerror=window.__nfpwned=4>"'
SECRET = "sk-viewer-test-0123456789abcdef"


def _selenium() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        return f"no {CHROMIUM} / {CHROMEDRIVER} (apt-get install chromium chromium-driver; .ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (it is in the test extra)"
    return None


SKIP = _selenium()
needs_browser = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _chat(content: str, **extra: object) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}


def _turn2(i: int) -> dict:
    """A session's second, streamed request; session 1's carries its first answer (a dependency)."""
    doc = _chat(f"{BODY} task {i}", stream=True)
    if i == 1:
        doc["messages"] += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "again"}]
    return doc


def _digest(folder: Path) -> dict[str, str]:
    """Every file's sha256, LMDB's lock file aside (a reader registers itself there by design)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "lock.mdb"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An nfladder-like output folder: a store recorded through nfproxy and replayed with one miss,
    a report, gate verdicts, outcome rows and a plot, all carrying planted markup."""
    out = tmp_path_factory.mktemp("nfview") / "out"
    out.mkdir()
    store = out / "log.lmdb"
    upstream = FakeUpstream(responder=lambda doc, n: ANSWER).start()
    try:
        rec = start_nfproxy("--mode", "record", "--upstream", upstream.url, "--store", str(store), "--record-timing")
        try:
            auth = {"authorization": f"Bearer {SECRET}"}
            with loopback.client(base_url=rec.url, timeout=20) as c:
                for i, (cond, task) in enumerate([("live", TASK), ("live", "T2"), ("t0", TASK)]):
                    labels = {"x-nf-session": f"{cond}-r0-{i}", "x-nf-task": task, "x-nf-condition": cond,
                              "x-nf-replicate": "0", **auth}
                    assert c.post("/v1/chat/completions", json=_chat(f"{BODY} task {i}"), headers=labels).status_code == 200
                    r = c.post("/v1/chat/completions", json=_turn2(i), headers=labels)
                    assert r.status_code == 200 and "[DONE]" in r.text
        finally:
            assert rec.stop() == 0, rec.output
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--replay-log-in-store")
        try:
            labels = {"x-nf-session": "replay-r0-0", "x-nf-task": TASK, "x-nf-condition": "replay", **auth}
            with loopback.client(base_url=rep.url, timeout=20) as c:
                assert c.post("/v1/chat/completions", json=_chat(f"{BODY} task 0"), headers=labels).status_code == 200
                assert c.post("/v1/chat/completions", json=_chat(f"{BODY} task 0, changed"),
                              headers=labels).status_code == 404
                # a request carrying an answer this replay session was never served: a call-order violation
                early = {**labels, "x-nf-session": "replay-r0-1", "x-nf-task": "T2"}
                assert c.post("/v1/chat/completions", json=_turn2(1), headers=early).status_code == 412
        finally:
            assert rep.stop() == 3, rep.output  # the strict replay saw its miss
    finally:
        upstream.stop()
    report = json.loads((ROOT / "examples/real-ladder/report.json").read_text())
    report["conditions"][TASK] = report["conditions"]["live"]
    report["warnings"] = [f"planted {BODY}"]
    (out / "report.json").write_text(json.dumps(report))
    shutil.copy(ROOT / "examples/real-ladder/ladder.png", out / "ladder.png")
    case = {"passes": 3, "n": 4}
    (out / "gate.json").write_text(json.dumps({"verdicts": [
        {"case_id": TASK, "verdict": "regressed", "base_a": case, "base_b": case, "candidate": {"passes": 0, "n": 4},
         "floor": 0.41}], "counts": {"regressed": 1}}))
    rows = [{"task_id": TASK, "condition": "live", "replicate": 0, "outcome": 1, "session": "live-r0-0",
             "detail": BODY},
            {"task_id": "T2", "condition": "live", "replicate": 0, "outcome": 1, "session": "live-r0-1"},
            {"task_id": "T2", "condition": "live", "replicate": 1, "outcome": 1},
            {"task_id": TASK, "condition": "live", "replicate": 1, "outcome": 0},
            {"task_id": TASK, "condition": "t0", "replicate": 0, "outcome": 1, "session": "t0-r0-2"}]
    (out / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield out


@pytest.fixture(scope="module")
def before(folder: Path) -> dict[str, str]:
    return _digest(folder)


def start_viewer(folder: Path, *args: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A real nfview on `folder` (port 0): the process, its URL and its output lines so far (growing)."""
    proc = subprocess.Popen([sys.executable, "-m", "noisefloor.viewer.cli", str(folder), "--listen", "127.0.0.1:0",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("nfview: http"):
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    assert ready.wait(30) and proc.poll() is None, "".join(lines)
    return proc, lines[-1].split()[1].rstrip("/"), lines


@pytest.fixture(scope="module")
def viewer(folder: Path, before: dict[str, str]) -> Iterator[str]:
    proc, url, lines = start_viewer(folder)
    yield url
    proc.terminate()
    assert proc.wait(10) == 0, "".join(lines)


@pytest.fixture(scope="module")
def browser(viewer: str) -> Iterator[object]:
    if SKIP:
        pytest.skip(SKIP)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="nfview-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def visit(driver, url: str, shot: str | None = None):  # type: ignore[no-untyped-def]
    """Open a page and wait for the app to say it rendered; then nothing planted may have run."""
    driver.get(url)
    return settle(driver, shot)


def settle(driver, shot: str | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 20
    # ready for the route now in the address bar: a click's hashchange is handled after the click
    # returns, so until then the page still says "ready" for the route it came from
    rendered = ("return document.body.getAttribute('data-state') === 'ready' && "
                "document.body.getAttribute('data-rendered') === (location.hash || '#/report')")
    while not driver.execute_script(rendered):
        state = driver.execute_script("return document.body.getAttribute('data-state')")
        assert state != "error", driver.find_element("id", "main").text
        assert time.monotonic() < deadline, f"page did not render: {state}"
        time.sleep(0.05)
    assert_nothing_ran(driver)
    if shot and os.environ.get("NF_SCREENSHOTS"):
        Path(os.environ["NF_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(os.environ["NF_SCREENSHOTS"]) / f"nfview-{shot}.png"))
    return driver


def assert_nothing_ran(driver) -> None:  # type: ignore[no-untyped-def]
    assert driver.execute_script("return window.__nfpwned === undefined"), "planted markup ran"
    scripts = driver.execute_script("return [...document.scripts].map(s => s.getAttribute('src'))")
    assert scripts == ["/static/app.js"], scripts
    planted = driver.execute_script("return document.querySelectorAll('img[src=x], img[src=y], img[src=z], "
                                    "[onerror]').length")
    assert planted == 0


def rows(driver, table: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{table} tbody tr')].map(r => [...r.cells].map(c => c.textContent))")


@needs_browser
def test_report_renders_with_intervals_plot_gate_and_planted_names_as_text(browser, viewer):
    d = visit(browser, viewer + "/#/report", "report")
    table = rows(d, "conditions")
    assert [r[0] for r in table] == ["live", "t0", "replay", TASK]  # the planted name, as text
    assert table[0][3].startswith("0.22037")
    assert d.execute_script("return document.querySelectorAll('#conditions svg.bar rect.ci').length") == 4
    assert d.execute_script("const i = document.querySelector('img.plot'); return i.complete && i.naturalWidth") > 100
    gate = rows(d, "gate")
    assert gate[0][:2] == [TASK, "regressed"]
    assert BODY in d.find_element("id", "warnings").text
    assert "replay_source" in d.find_element("id", "provenance").text


@needs_browser
def test_the_report_opens_with_each_conditions_outcome_grid_flipping_tasks_first(browser, viewer):
    d = visit(browser, viewer + "/#/report")
    first = d.execute_script("return document.querySelector('#main h2').textContent")
    assert first.startswith("Outcomes: tasks"), first
    live = d.find_element("css selector", ".grid[data-condition='live']")
    tasks = d.execute_script("return [...arguments[0].querySelectorAll('.grid-row')].map(r => [r.dataset.task, "
                             "r.classList.contains('flips'), [...r.querySelectorAll('a.cell')].map(a => a.className)])", live)
    assert tasks == [[TASK, True, ["cell cell-P", "cell cell-F"]], ["T2", False, ["cell cell-P", "cell cell-P"]]], tasks
    live.find_element("css selector", ".flips a.cell[data-replicate='0']").click()
    settle(d)
    assert {r[3] for r in rows(d, "exchange-list")} == {"live-r0-0"}  # that run's exchanges


@pytest.fixture(scope="module")
def big_viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An output folder of 10,000 runs: 2,000 tasks x 5 replicates, every tenth task flipping."""
    out = tmp_path_factory.mktemp("nfview-big")
    with (out / "outcomes.jsonl").open("w") as fh:
        for t in range(2000):
            for r in range(5):
                fh.write(json.dumps({"task_id": f"task/{t}", "condition": "live", "replicate": r,
                                     "outcome": int(t % 10 == 0 and r % 2 == 0 or t % 10 != 0), "session": f"s{t}-{r}"}) + "\n")
    proc, url, lines = start_viewer(out)
    yield url
    proc.terminate()
    assert proc.wait(10) == 0, "".join(lines)


@needs_browser
def test_the_outcome_grid_stays_usable_for_thousands_of_runs(browser, big_viewer):
    d = visit(browser, big_viewer + "/#/report", "grid-10k")
    shown = d.execute_script("return [...document.querySelectorAll('.grid .grid-row')].map(r => r.dataset.task)")
    assert len(shown) == 100 and shown[:3] == ["task/0", "task/10", "task/20"]  # the 200 flipping tasks first
    assert "200 of 2000 tasks flip across 5 replicates (10000 runs)" in d.find_element("id", "grid").text
    d.find_element("css selector", "button.grid-all").click()
    assert d.execute_script("return document.querySelectorAll('.grid a.cell').length") == 10_000


@needs_browser
def test_numbers_read_as_the_command_line_prints_them_ties_included(browser, viewer):
    d = visit(browser, viewer + "/#/report")
    cases = [(0.40625, 4), (-0.40625, 4), (0.125, 2), (0.375, 2), (2.5, 0), (3.5, 0), (0.0729166, 5), (0.1, 4),
             (1e-07, 4), (0.18761, 3), (1 / 3, 6)]
    shown = d.execute_script("return arguments[0].map(([x, n]) => num(x, n))", [list(c) for c in cases])
    assert shown == [f"{x:.{n}f}" for x, n in cases]


@needs_browser
def test_a_report_row_links_to_the_sessions_behind_it(browser, viewer):
    d = visit(browser, viewer + "/#/report")
    d.find_element("css selector", "#conditions tr[data-condition='live'] a.to-sessions").click()
    settle(d, "sessions")
    got = rows(d, "session-list")
    assert sorted(r[0] for r in got) == ["live-r0-0", "live-r0-1"]
    assert {r[1] for r in got} == {"live"} and {r[4] for r in got} == {"2"}
    d.find_element("css selector", "#session-list a.session-link").click()
    settle(d)
    assert {r[3] for r in rows(d, "exchange-list")} == {"live-r0-0"}


@needs_browser
def test_exchange_filters_and_search(browser, viewer):
    d = visit(browser, viewer + "/#/exchanges", "exchanges")
    every = rows(d, "exchange-list")
    assert len(every) == 9  # six recorded, a replay hit, a miss and a call-order violation

    def apply(**fields: str) -> list[list[str]]:
        form = d.find_element("id", "filters")
        for name, value in fields.items():
            box = form.find_element("name", name)
            if box.get_attribute("type") == "checkbox":
                if box.is_selected() != (value == "1"):
                    box.click()
            elif box.tag_name == "select":
                from selenium.webdriver.support.ui import Select

                Select(box).select_by_value(value)
            else:
                box.clear()
                box.send_keys(value)
        form.find_element("css selector", "button[type=submit]").click()
        return rows(settle(d), "exchange-list")

    assert {r[5] for r in apply(condition="t0")} == {"t0"}
    missed = apply(condition="", result="miss")
    assert len(missed) == 1 and missed[0][8] == "404" and missed[0][4] == TASK
    assert len(apply(result="", status="4xx")) == 2
    (late,) = apply(status="", order="1")
    assert late[9] == "order_violation" and "exchange 3" in late[10]  # the request that should have come first
    apply(order="0")
    assert {r[4] for r in apply(status="", task=TASK)} == {TASK}
    assert len(apply(task="", q="CHANGED")) == 1  # case-insensitive, in the request body
    assert apply(q="", model="no-such-model") == []
    assert len(apply(model="")) == 9


@needs_browser
def test_one_exchange_decoded_with_headers_erased_and_stream_chunks(browser, viewer):
    d = visit(browser, viewer + "/#/exchanges?condition=live")
    streamed = next(r for r in rows(d, "exchange-list") if r[3] == "live-r0-0" and r[0] == "2")
    d.find_element("css selector", f"#exchange-list tr[data-id='{streamed[0]}'] a.ex-link").click()
    settle(d, "exchange")
    body = d.find_element("id", "request-body").text
    assert '"messages": [' in body and json.dumps(BODY)[1:-1] in body  # pretty-printed, planted markup as text
    headers = d.find_element("id", "request-headers").text
    assert "[redacted]" in headers and SECRET not in d.page_source
    chunks = rows(d, "chunks")
    assert len(chunks) >= 6 and float(chunks[-1][1]) > float(chunks[0][1])  # each chunk with its time
    assert chunks[-1][3].strip() == "data: [DONE]"
    assert any("<" in c[3] for c in chunks)  # the planted answer, split across events, as text


@needs_browser
def test_a_miss_beside_its_nearest_recorded_request(browser, viewer):
    d = visit(browser, viewer + "/#/exchanges?result=miss")
    d.find_element("css selector", "#exchange-list a.ex-link").click()
    settle(d, "miss")
    diff = rows(d, "diff")
    changed = [r for r in diff if r[0] != r[1]]
    # "task 0", "task 1" and "task 2" are equally near the asked "task 0, changed" (one differing
    # path each): the earliest recorded is the nearest, whatever the index's sketch estimated
    assert changed and any('task 0"' in r[0] for r in changed) and any("task 0, changed" in r[1] for r in changed)
    d.find_element("id", "nearest-link").click()
    settle(d)
    assert d.find_element("tag name", "h1").text == "Exchange 1"  # that nearest request


@needs_browser
def test_outcome_rows_link_to_their_session(browser, viewer):
    d = visit(browser, viewer + "/#/outcomes")
    got = rows(d, "outcome-list")
    assert got[0][0] == TASK and got[0][5] == BODY
    d.find_element("css selector", "#outcome-list a.session-link").click()
    assert {r[3] for r in rows(settle(d), "exchange-list")} == {"live-r0-0"}


def test_headers_refuse_writes_and_foreign_hosts(viewer):
    r = loopback.get(viewer + "/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert loopback.post(viewer + "/api/summary").status_code == 405
    assert loopback.get(viewer + "/api/summary", headers={"host": "evil.example:80"}).status_code == 421
    assert loopback.get(viewer + "/static/../report.json").status_code == 404
    assert loopback.get(viewer + "/plot/report.json").status_code == 404
    doc = loopback.get(viewer + "/api/exchanges", params={"limit": 1}).text
    assert "<" not in doc and "\\u003cimg" in doc  # JSON that holds no tag even when sniffed
    bad = loopback.get(viewer + "/api/exchanges", params={"status": "4XY"})
    assert bad.status_code == 400 and "is not a status filter" in bad.text
    assert loopback.get(viewer + "/api/sessions", params={"status": "4XX"}).status_code == 200  # any case


def _raw(viewer: str, target: str, host: str | None) -> int:
    """A request as a hostile client writes it (no client-side path cleaning); its status."""
    import socket

    port = int(viewer.rsplit(":", 1)[1].strip("/"))
    head = f"GET {target} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "") + "Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head.encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def test_traversal_and_foreign_hosts_on_the_raw_socket(viewer):
    port = viewer.rsplit(":", 1)[1].strip("/")
    for target in ("/static/../report.json", "/static/..%2freport.json", "/static/%2e%2e%2fgate.json",
                   "/plot/..%2freport.json", "/plot/%2e%2e/log.lmdb/data.mdb", "/static//etc/passwd",
                   "/static/app.js%00.png", "/../report.json"):
        assert _raw(viewer, target, f"127.0.0.1:{port}") in (400, 404), target
    for host in (None, "evil.example", f"127.0.0.1.evil.example:{port}", f"evil.example:{port}", "127.0.0.1:1",
                 f"localhost.evil:{port}", f"[::ffff:7f00:1]:{port}"):
        assert _raw(viewer, "/api/summary", host) in (400, 421), host
    assert _raw(viewer, "/api/summary", f"127.0.0.1:{port}") == 200


def test_pages_follow_a_cursor_never_the_whole_store(folder, monkeypatch):
    monkeypatch.setattr(pages, "SCAN", 3)
    with Store.open(folder / "log.lmdb", write=False) as store:
        seen, cursor, calls = [], 0, 0
        while cursor is not None:
            page = pages.exchange_page(store, cursor, 2, pages.Filters())
            assert page["scanned"] <= 3
            seen += [x["id"] for x in page["items"]]
            cursor, calls = page["next"], calls + 1
        assert seen == list(range(1, 10)) and calls >= 5
        only = pages.exchange_page(store, 0, 50, pages.Filters(condition="replay"))
        assert only["items"] == [] and only["next"] == 3  # nothing in the first 3: go on from there


def test_nfproxy_log_filters_by_status_miss_model_and_limit(folder):
    """The filters through `nfproxy log`'s own command in this process (a process each would cost
    ~0.5 CPU-s for the same code); the refused filter through a real process, its exit and one line."""
    from click.testing import CliRunner

    from noisefloor.proxy.cli._listing_cmds import log_cmd

    exe = Path(sys.executable).with_name("nfproxy")

    def listed(*args: str) -> list[dict]:
        r = CliRunner().invoke(log_cmd, ["--store", str(folder / "log.lmdb"), "--json", *args], catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines()]

    (miss,) = listed("--miss")
    assert miss["replay"]["result"] == "miss" and miss in listed("--status", "4xx")
    assert len(listed("--status", "4xx")) == 2 and listed("--result", "order_violation")[0]["id"] == 9
    assert [x["id"] for x in listed("--limit", "3")] == [1, 2, 3]
    assert len(listed("--model", "gpt-4o-mini-2024-07-18")) == 7  # six recorded and the replayed hit
    assert [x["id"] for x in listed("--result", "hit")] == [7]
    assert len(listed("--condition", "live", "--status", "200", "--limit", "10")) == 4
    assert len(listed("--status", "4XX")) == 2
    bad = subprocess.run([str(exe), "log", "--store", str(folder / "log.lmdb"), "--status", "40x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "is not a status filter" in bad.stderr and bad.stderr.count("\n") == 1
    assert "Traceback" not in bad.stderr


def test_the_folder_is_byte_identical_afterwards(folder, before, viewer):
    # runs last in this module: every page above has been read
    assert _digest(folder) == before


def test_a_folder_is_read_by_what_its_files_hold(tmp_path):
    from noisefloor.viewer.source import SourceError, locate, read_json

    (tmp_path / "mine.json").write_text(json.dumps({"conditions": {"live": {}}}))  # nfanalyze --json mine.json
    (tmp_path / "verdicts.json").write_text(json.dumps({"verdicts": []}))  # nfanalyze gate --json verdicts.json
    (tmp_path / "other.json").write_text("{broken")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # a parser's recursion, not a traceback
    src = locate(tmp_path)
    assert src.report.name == "mine.json" and src.gate.name == "verdicts.json" and src.store is None
    assert src.plot("mine.json") is None  # only listed plots are ever served
    with pytest.raises(SourceError, match="holds no nfproxy store"):
        locate(_empty(tmp_path))
    with pytest.raises(SourceError, match="nested too deeply"):
        read_json(tmp_path / "deep.json")


def _empty(root: Path) -> Path:
    (root / "empty").mkdir()
    return root / "empty"


def test_the_grid_codes_each_run_and_puts_flipping_tasks_first():
    from noisefloor.viewer.grid import grid

    rows = [{"task_id": "t/10", "condition": "c", "replicate": 0, "outcome": 1},
            {"task_id": "t/10", "condition": "c", "replicate": 2, "outcome": 1},
            {"task_id": "t/2", "condition": "c", "replicate": 0, "outcome": 0, "session": "s0"},
            {"task_id": "t/2", "condition": "c", "replicate": 1, "outcome": 1, "session": "s1"},
            {"task_id": "t/9", "condition": "c", "replicate": 1, "outcome": 0, "failure": "agent_error"},
            {"task_id": "t/3", "condition": "c", "replicate": 0, "outcome": 1, "failure": "pass"},  # a grader's word
            {"task_id": "t/3", "condition": "c", "replicate": 1, "outcome": 0, "failure": "wrong_output"},
            # hostile rows are skipped, never a huge grid or a traceback
            {"task_id": "t/1", "condition": "c", "replicate": 10**9, "outcome": 1},
            {"task_id": "t/1", "condition": "c", "replicate": True, "outcome": 1},
            {"task_id": "t/1", "condition": "c", "replicate": "0", "outcome": 1}, ["not", "a", "row"],
            {"task_id": "t/4", "condition": "d", "replicate": 0, "outcome": "1"}]
    (c, d) = grid(rows)["conditions"]  # type: ignore[arg-type]
    assert [(t["task"], t["flips"], t["cells"]) for t in c["tasks"]] == [
        ("t/2", True, "FP."), ("t/3", True, "PF."), ("t/9", False, ".E."), ("t/10", False, "P.P")]
    assert c["tasks"][0]["sessions"] == ["s0", "s1", None] and c["tasks"][1]["sessions"] is None
    assert (c["replicates"], c["flipping"], c["runs"]) == (3, 2, 7)
    assert d["tasks"] == [{"task": "t/4", "flips": False, "cells": ".", "sessions": None}]


def test_links_out_of_the_folder_nan_outcomes_and_bad_requests(tmp_path):
    """A folder whose ladder.png and report.json are links to files outside it, whose outcome rows
    hold NaN, and a client that sends no Host: nothing outside is served, the API answers 200, and
    nfview's output has one line per bad request, no traceback."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text("PRIVATE KEY")
    (private / "report.json").write_text(json.dumps({"conditions": {"secret": {}}}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "ladder.png").symlink_to(private / "id_rsa")
    (out / "report.json").symlink_to(private / "report.json")
    (out / "inside.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (out / "also.png").symlink_to("inside.png")  # a link within the folder is fine
    rows = [{"task_id": "t", "condition": "c", "replicate": 0, "outcome": float("nan")},
            {"task_id": "t", "condition": "c", "replicate": 1, "outcome": float("inf"), "confidence": float("-inf")},
            {"task_id": "\ud800", "condition": "c", "replicate": 2, "outcome": 1}]  # a lone surrogate, as JSON may say
    (out / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc, url, lines = start_viewer(out)
    try:
        summary = loopback.get(url + "/api/summary").json()
        assert summary["source"]["plots"] == ["also.png", "inside.png"] and summary["report"] is None
        assert loopback.get(url + "/plot/ladder.png").status_code == 404
        assert loopback.get(url + "/plot/also.png").content == b"\x89PNG\r\n\x1a\n"
        (out / "inside.png").unlink()
        (out / "inside.png").symlink_to(private / "id_rsa")  # swapped for a link after the start
        assert loopback.get(url + "/plot/inside.png").status_code == 404
        assert b"PRIVATE" not in loopback.get(url + "/plot/also.png").content
        got = loopback.get(url + "/api/outcomes")
        assert got.status_code == 200, got.text
        assert [(r["outcome"], r.get("confidence")) for r in got.json()["items"]] == [("nan", None), ("inf", "-inf"),
                                                                                       (1, None)]
        assert got.json()["items"][2]["task_id"] == "\ud800"  # escaped as JSON escapes it: valid UTF-8
        assert _raw(url, "/api/summary", None) == 400
        time.sleep(0.5)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    text = "".join(lines)
    assert "Traceback" not in text and "PRIVATE" not in text, text
    (bad,) = [line for line in lines if "Host" in line]
    assert bad.startswith("nfview: ") and bad.count("\n") == 1, text


def test_a_port_out_of_range_or_taken_is_one_line(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"conditions": {}}))
    proc, url, lines = start_viewer(tmp_path)
    try:
        for listen, status, words in (("127.0.0.1:99999", 64, "port from 0 to 65535"),
                                      (url.removeprefix("http://"), 5, "cannot listen on 127.0.0.1:")):
            r = subprocess.run([sys.executable, "-m", "noisefloor.viewer.cli", str(tmp_path), "--listen", listen],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == status and words in r.stderr, r.stderr
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_a_store_without_outcome_rows_shows_its_trajectories(tmp_path):
    """An agent recording on its own: the summary carries sessions, steps, tools and models."""
    body = json.dumps(_chat("hello")).encode()
    answer = json.dumps({"model": "m-9", "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}}]}).encode()
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData, ResponseData

    with Store.open(tmp_path / "log.lmdb", write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for session in ("a", "b"):
            rec.finish(rec.begin(RequestData("POST", "http://u/v1/chat/completions", "u", "/v1/chat/completions", (),
                                             body), Labels(session)),
                       ResponseData(200, (("content-type", "application/json"),), answer))
    proc, url, lines = start_viewer(tmp_path)
    try:
        doc = loopback.get(url + "/api/summary").json()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, "".join(lines)
    t = doc["trajectories"]
    assert t["sessions"] == 2 and t["tools"] == {"search": 2} and t["models"] == {"m-9": 2}


def test_the_session_page_says_which_recorded_session_a_replay_followed_and_where_it_diverged(tmp_path):
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.replay.replayer import Replayer
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData, ResponseData

    def ask(text: str) -> RequestData:
        return RequestData("POST", "http://u/v1/chat/completions", "u", "/v1/chat/completions", (),
                           json.dumps(_chat(text)).encode())

    answer = ResponseData(200, (("content-type", "application/json"),),
                          json.dumps({"choices": [{"message": {"role": "assistant", "content": "fine"}}]}).encode())
    with Store.open(tmp_path / "log.lmdb", write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for text in ("first step", "second step"):
            rec.finish(rec.begin(ask(text), Labels("recorded-1")), answer)
        rep = Replayer(s, Rules())
        rep.answer(ask("first step"), Labels("again"))
        rep.answer(ask("second step, changed"), Labels("again"))
        page = pages.session_page(s, 0, pages.Filters())
    again = next(x for x in page["items"] if x["session"] == "again")
    assert again["followed"] == {"recorded-1": 1}
    assert again["diverged"] == {"step": 1, "result": "miss", "session": "recorded-1", "path": "/body/messages/0/content",
                                 "cut_off": 0}
