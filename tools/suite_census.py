"""Where the test suite's CPU goes, by test and by process: a developer's tool, not part of the package.

`python tools/suite_census.py install` puts a startup hook into this venv (a .pth file); then
`NF_CENSUS=/tmp/census.jsonl python -m pytest ...` makes every Python process of the venv (pytest's
workers and every nfproxy, nfladder, agent or verifier process a test starts) append at exit its
command, the test that was running (pytest's PYTEST_CURRENT_TEST, inherited by subprocesses) and
its own CPU seconds. `python tools/suite_census.py report /tmp/census.jsonl` sums them per test
and per command. `uninstall` removes the hook. Without NF_CENSUS the hook does nothing.

Subprocesses of a test are charged to it; a worker's own CPU is charged to the worker (pytest's
--durations gives the wall time per test). Processes killed by a signal do not report.
"""

from __future__ import annotations

import json
import re
import sys
import sysconfig
from collections import defaultdict
from pathlib import Path

HOOK = '''import os
_p = os.environ.get("NF_CENSUS")
if _p:
    import atexit, json, resource, sys, time
    def _nf_census_report(p=_p, t0=time.time()):
        try:
            r = resource.getrusage(resource.RUSAGE_SELF)
            line = json.dumps({"argv": sys.argv[:4], "test": os.environ.get("PYTEST_CURRENT_TEST"),
                               "cpu": r.ru_utime + r.ru_stime, "wall": time.time() - t0})
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, line.encode() + b"\\n")
            finally:
                os.close(fd)
        except Exception:
            pass
    atexit.register(_nf_census_report)
'''


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def install() -> None:
    (_site() / "nf_census_hook.py").write_text(HOOK)
    (_site() / "nf_census.pth").write_text("import nf_census_hook\n")
    print(f"census hook installed in {_site()}; run the suite with NF_CENSUS=/tmp/census.jsonl")


def uninstall() -> None:
    for name in ("nf_census_hook.py", "nf_census.pth"):
        (_site() / name).unlink(missing_ok=True)
    print("census hook removed")


def _command(argv: list[str]) -> str:
    if not argv:
        return "?"
    head = Path(argv[0]).name
    if head in ("-m", "-c") and len(argv) > 1:
        return f"{head} {argv[1]}"[:60]
    return head[:60]


def report(path: str, top: int = 40) -> None:
    per_test: dict[str, float] = defaultdict(float)
    per_file: dict[str, float] = defaultdict(float)
    per_cmd: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    total = 0.0
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        test = re.sub(r" \((setup|call|teardown)\)$", "", rec.get("test") or "(no test: a worker or the session)")
        cpu = float(rec["cpu"])
        total += cpu
        per_test[test] += cpu
        per_file[test.split("::")[0]] += cpu
        c = per_cmd[_command(rec.get("argv") or [])]
        c[0] += 1
        c[1] += cpu
    print(f"{total:.0f} CPU-s in all")
    print("\nby file:")
    for name, cpu in sorted(per_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {cpu:8.1f}  {name}")
    print("\nby test:")
    for name, cpu in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {cpu:8.1f}  {name}")
    print("\nby command (processes, CPU-s):")
    for name, (n, cpu) in sorted(per_cmd.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {cpu:8.1f}  {int(n):6d}  {name}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "install":
        install()
    elif cmd == "uninstall":
        uninstall()
    elif cmd == "report" and len(sys.argv) > 2:
        report(sys.argv[2])
    else:
        sys.exit("usage: python tools/suite_census.py install | uninstall | report CENSUS.jsonl")
