"""Hostile files in, one line out (issue 24, items 3-5): inspect logs that expand to 1 GiB or nest
200,000 deep or hold the wrong types, outcome files with a latin-1 byte, a BOM or a 1 MiB field,
labels carrying terminal escapes, output paths that cannot be written. Every failure is one line
naming the file and the fix, exit 1, no traceback, nothing half-written, peak RSS under 1 GB."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from noisefloor import exit_codes
from noisefloor.analyzer.cli import main as nfanalyze_main

# An OSC sequence (sets the terminal's title), a CSI one, a C1 CSI, a bidi override, a newline.
HOSTILE = "HumanEval/0\x1b]0;pwned\x07\x1b[31m\x9b2J\u202e\nwarning: forged"


def deflate_bomb_zip(path: Path, name: str, size: int) -> None:
    """A zip whose one deflated entry expands to `size` bytes of spaces (about 1 MB on disk per GiB),
    written by hand: the same fully flushed deflate block repeated, then an empty final block."""
    chunk = 8 << 20
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = (c.compress(b" " * chunk) + c.flush(zlib.Z_FULL_FLUSH)) * (size // chunk) + b"\x03\x00"
    fn = name.encode()
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, 0, len(data), size, len(fn), 0) + fn
    central = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, 0, len(data), size, len(fn),
                          0, 0, 0, 0, 0, 0) + fn
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    path.write_bytes(local + data + central + end)


def eval_log(path: Path, header: object, samples: object) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", header if isinstance(header, str) else json.dumps(header))
        z.writestr("summaries.json", samples if isinstance(samples, str) else json.dumps(samples))
    return path


GOOD_HEADER = {"eval": {"model": "m", "run_id": "r1", "scorers": [{"name": "match"}]}}


def sample(i: int, epoch: object = 1, value: object = "C") -> dict:
    return {"id": i, "epoch": epoch, "scores": {"match": {"value": value}}}


def one_line_error(result, *must: str) -> str:
    out = result.output.strip()
    assert result.exit_code == exit_codes.INPUT, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    for m in must:
        assert m in out, out
    return out


def run_cli(*args: str):
    return CliRunner().invoke(nfanalyze_main, list(args))


def test_inspect_logs_with_the_wrong_types_are_one_line_each(tmp_path):
    cases = {
        "header-list": ([1, 2], [sample(1)], "the header is a list"),
        "epoch-string": (GOOD_HEADER, [sample(1, "two")], "epoch 'two'"),
        "score-string": (GOOD_HEADER, [{"id": 1, "epoch": 1, "scores": {"match": "C"}}], "scores that are not"),
        "score-value-string": (GOOD_HEADER, [sample(1, 1, "0.7")], "is not pass/fail"),
        "samples-object": (GOOD_HEADER, {"a": 1}, "samples are a dict"),
        "deep": (GOOD_HEADER, "[" * 200_000 + "]" * 200_000, "nested too deep"),
        "not-json": (GOOD_HEADER, "{oops", "not valid JSON"),
    }
    for name, (header, samples, message) in cases.items():
        log = eval_log(tmp_path / f"{name}.eval", header, samples)
        out = tmp_path / f"{name}.json"
        result = run_cli("--inspect-logs", f"live={log}", "--json", str(out))
        line = one_line_error(result, str(log), message)
        assert "damaged" in line or "pass" in line or "nested" in line, line  # says what to do or what it is
        assert not out.exists()  # nothing half-written


def _peak_rss_mb(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `argv` under a fresh Python parent, so the peak resident size is that command's alone."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); "
             "print('RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
             "sys.exit(r.returncode)")
    r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300)
    rss = int(r.stderr.rsplit("RSS ", 1)[1].split()[0]) / 1024
    r.stderr = r.stderr.rsplit("RSS ", 1)[0]
    return r, rss


@pytest.mark.slow
def test_a_header_expanding_to_1_gib_and_200k_deep_json_stay_under_1_gb(tmp_path):
    bomb = tmp_path / "bomb.eval"
    deflate_bomb_zip(bomb, "header.json", 1 << 30)
    assert bomb.stat().st_size < 4 << 20
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    deep_rows = tmp_path / "deep.jsonl"
    deep_rows.write_text('{"task_id": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    for args, message in ((("--inspect-logs", f"live={bomb}"), "larger than 64 MiB"),
                          (("--inspect-logs", f"live={deep}"), "nested too deep"),
                          (("--outcomes", str(deep_rows)), "nested too deep")):
        r, rss = _peak_rss_mb([sys.executable, "-m", "noisefloor.analyzer.cli", *args])
        assert r.returncode == exit_codes.INPUT and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert rss < 1024, f"peak RSS {rss:.0f} MB for {args}"


def _rows(tmp_path: Path, task: str = "t") -> list[dict]:
    return [{"task_id": f"{task}{i}", "condition": c, "replicate": r, "outcome": (i + r) % 2}
            for c in ("live", "replay") for i in range(4) for r in range(3)]


def test_outcome_csv_with_a_bom_a_1_mib_field_and_a_latin1_byte(tmp_path):
    head = "task_id,condition,replicate,outcome,detail\n"
    body = "".join(f"{r['task_id']},{r['condition']},{r['replicate']},{r['outcome']},ok\n" for r in _rows(tmp_path))
    good = tmp_path / "bom.csv"
    good.write_bytes(b"\xef\xbb\xbf" + (head + body).encode() + b"t0,live,9,1," + b"x" * (1 << 20) + b"\n")
    result = run_cli("--outcomes", str(good), "--bootstrap", "200", "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["conditions"]["live"]["tasks"] == 4
    bad = tmp_path / "latin1.csv"
    bad.write_bytes((head + body).encode() + "t9,live,0,1,caf\xe9\n".encode("latin-1"))
    one_line_error(run_cli("--outcomes", str(bad)), f"{bad}:26", "not UTF-8", "iconv")
    bad_jsonl = tmp_path / "latin1.jsonl"
    bad_jsonl.write_bytes(b'{"task_id": "caf\xe9", "condition": "live", "replicate": 0, "outcome": 1}\n')
    one_line_error(run_cli("--outcomes", str(bad_jsonl)), f"{bad_jsonl}:1", "not UTF-8")
    typed = tmp_path / "typed.jsonl"
    typed.write_text('{"task_id": {"a": 1}, "condition": "live", "replicate": 0, "outcome": 1}\n')
    one_line_error(run_cli("--outcomes", str(typed)), f"{typed}:1", "task_id is a dict")


def test_labels_with_escape_sequences_are_shown_visible_in_the_terminal_and_escaped_in_markdown(tmp_path):
    rows = [{**r, "task_id": HOSTILE + r["task_id"], "condition": r["condition"] + "|*x*"} for r in _rows(tmp_path)]
    rows = [r for r in rows if not (r["condition"].startswith("replay") and r["task_id"].endswith("3"))]
    f = tmp_path / "o.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = tmp_path / "r.md"
    result = run_cli("--outcomes", str(f), "--bootstrap", "200", "--markdown", str(md))
    assert result.exit_code == 0, result.output
    for text in (result.output, md.read_text()):
        assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in text), text
        assert "\\x1b]0;pwned\\x07" in text.replace("\\\\", "\\") or "\\x1b\\]0;pwned\\x07" in text.replace("\\\\", "\\")
        assert "\nwarning: forged" not in text  # a newline in a label cannot forge a line
    assert "live\\|\\*x\\*" in md.read_text()  # a label cannot break the table or turn bold


def test_output_paths_are_checked_before_any_work_and_written_atomically(tmp_path):
    f = tmp_path / "o.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in _rows(tmp_path)))
    for option in ("--json", "--markdown", "--plot"):
        one_line_error(run_cli("--outcomes", str(f), option, str(tmp_path / "nodir" / "out")),
                       option, "does not exist", "mkdir")
    one_line_error(run_cli("--outcomes", str(f), "--json", str(tmp_path)), "is a folder")
    result = run_cli("--outcomes", str(f), "--bootstrap", "200", "--json", str(tmp_path / "r.json"),
                     "--plot", str(tmp_path / "r.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl", "r.json", "r.png"]  # no temporary left


def test_a_lone_surrogate_and_markup_in_labels_reach_no_terminal_or_report_raw(tmp_path):
    """A task id holding a lone surrogate (a JSON `\\ud800` with no pair) and a condition name
    holding HTML, in a real nfanalyze process: exit 0, the id printed as its escape (no traceback),
    and no Markdown field of report.md (the table, the interval notes, the carriers, the warnings)
    writes the markup raw."""
    tag = '<img src=x onerror="alert(1)">'
    rows = [{"task_id": f"t{i}\ud800" if i == 1 else f"t{i}", "condition": "live" if c == "live" else tag,
             "replicate": r, "outcome": r % 2 if c == "live" and i == 1 else i % 2}  # only t1 varies, in live
            for c in ("live", "replay") for i in range(4) for r in range(3)]
    rows = [r for r in rows if not (r["condition"] == tag and r["task_id"] == "t3")]  # a warning naming t3
    f = tmp_path / "o.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exe = Path(sys.executable).with_name("nfanalyze")
    md = tmp_path / "r.md"
    r = subprocess.run([str(exe), "--outcomes", str(f), "--bootstrap", "200", "--markdown", str(md)],
                       capture_output=True, timeout=120)
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in out, out
    assert "t1\\ud800 carries 100%" in out
    text = md.read_text()
    assert "t1\\\\ud800" in text  # Markdown's own escape of the backslash
    assert re.search(r"(?<!\\)<", text) is None, text  # every "<" escaped: no tag
    assert text.count("\\<img src=x onerror=\"alert\\(1\\)\"\\>") >= 6  # table, 3 notes, contrast, warning
    assert "interval" in text.split("| MDE |")[1].split("##")[0]  # the notes under the table name the condition


def test_the_provenance_and_a_designs_section_are_escaped_in_report_md_and_on_the_terminal():
    """nfladder's report.md: the provenance names models as the provider and the answers named
    them (an upstream's text) and the judge / gate sections are terminal tables of task ids; no
    field of them reaches Markdown as markup or a terminal as an escape sequence."""
    from noisefloor.display import md_block, visible_lines
    from noisefloor.ladder import provenance

    tag = "<script>alert(1)</script>\x1b]0;t\x07"
    m = {"models": {"requested": [tag], "served": ["m`x`"], "provider_lists": {"models": ["[a](http://e.x)"]}},
         "sampling": [{"condition": tag, "temperature": 0, "top_p": None, "seed": None}],
         "task_set": {"tasks": 1, "sha256": "0" * 64}, "dataset": {"path": "/d/<b>.jsonl", "sha256": None},
         "grader": ["g*1*"], "recording_id": "r", "recorded_exchanges": 1, "coupling": "c",
         "bootstrap": {"resamples": 10, "seed": 0}, "versions": {"noisefloor": "0"}}
    doc = provenance.markdown(m)
    assert re.search(r"(?<!\\)[<`\[*]", doc) is None, doc
    assert "\\<script\\>" in doc and "\\\\x1b\\]0;t\\\\x07" in doc
    shown = provenance.text(m) + visible_lines(f"judge {tag}\n  task {tag}")
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;t\\x07" in shown
    block = md_block(f"Gate: case {tag}\n{tag} regressed")
    assert all(line.startswith("    ") for line in block.splitlines()) and "\x1b" not in block  # a code block: inert
