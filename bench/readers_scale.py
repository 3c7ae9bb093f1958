"""The store's readers at scale, before and after: `nfproxy log` (plain and --json), `nfanalyze
STORE` and `nfproxy show` on stores kept by `bench/store_scale.py --build-only --keep DIR`, each
as its own process, run from this checkout and from another revision of the code (`--baseline`,
unpacked to a temporary folder and put first on the import path), interleaved round by round so
that both see the same load.

    python bench/store_scale.py --sizes 10000,100000 --build-only --keep DIR
    python bench/readers_scale.py --keep DIR --sizes 10000,100000 --baseline main [--json out.json]
    [--this-keep DIR2: the same stores migrated (`nfproxy migrate`), where this code's format is newer]

Per command: CPU seconds (user + system of the process, which moves far less than wall time on a
shared machine), wall seconds, peak RSS (VmHWM, which counts the store pages the process mapped)
and the most private memory seen (RssAnon, sampled). The CPU a reader spends per exchange is the
difference between two sizes over the difference of their exchange counts, so start-up (imports)
and the analysis, which grows with tasks rather than exchanges, cancel.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"src/noisefloor": "", "proxy": "proxy", "analyzer": "analyzer", "verifier": "verifier",
            "ladder": "ladder", "viewer": "viewer"}  # pyproject's package-dir: folder -> place under noisefloor/
ENTRY = {"nfproxy": "noisefloor.proxy.cli", "nfanalyze": "noisefloor.analyzer.cli"}


def unpack(rev: str, where: Path) -> Path:
    """The `noisefloor` package of git revision `rev`, laid out as an install would, under `where`."""
    where.mkdir()
    archive = where / "rev.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, *PACKAGES], stdout=fh, check=True)
    src = where / "src"
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    pkg = where / "pkg" / "noisefloor"
    pkg.parent.mkdir()
    (src / "src/noisefloor").rename(pkg)
    for folder, place in PACKAGES.items():
        if place:
            (src / folder).rename(pkg / place)
    compiled(pkg)
    return where / "pkg"


def compiled(folder: Path) -> None:
    """Byte-compile a tree once, so that no measured process compiles it (with PYTHONDONTWRITEBYTECODE
    set, as here, every process would compile what has no current .pyc: 0.07 CPU-s for all of it)."""
    compileall.compile_dir(str(folder), quiet=1)


def measure(argv: list[str], path: Path | None) -> dict[str, float]:
    """One process, its code from `path` (None: this checkout, as installed): CPU s, wall s, peak
    RSS and the most private memory seen (MB); its output discarded."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    tool, *args = argv
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", f"from {ENTRY[tool]} import main; main()", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    anon = 0
    status = Path(f"/proc/{proc.pid}/status")
    deadline = t + 1800
    while time.perf_counter() < deadline:
        pid, code, use = os.wait4(proc.pid, os.WNOHANG)  # reaped here: its own rusage
        if pid:
            break
        try:
            anon = max([anon] + [int(line.split()[1]) for line in status.read_text().splitlines()
                                 if line.startswith("RssAnon:")])
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError(f"{argv} ran past 30 minutes")
    if code:
        raise RuntimeError(f"{argv} exited with status {code}; run it by hand to see why")
    return {"cpu_s": use.ru_utime + use.ru_stime, "wall_s": time.perf_counter() - t,
            "rss_mb": use.ru_maxrss / 1024, "anon_mb": anon / 1024}


def commands(store: Path) -> dict[str, list[str]]:
    with_id = str(max(1, _count(store) // 2))
    return {"log": ["nfproxy", "log", "--store", str(store)],
            "log --json": ["nfproxy", "log", "--json", "--store", str(store)],
            "nfanalyze": ["nfanalyze", str(store), "--json", os.devnull],
            "show": ["nfproxy", "show", with_id, "--store", str(store)],
            "log --limit 1": ["nfproxy", "log", "--limit", "1", "--store", str(store)]}  # start-up


def _count(store: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from noisefloor.proxy.store.log import Store

    with Store.open(store, write=False) as s:
        return len(s)


def summary(results: dict[str, list[dict[str, object]]]) -> list[dict[str, object]]:
    """Per command and code: mean CPU s and most private memory at each size; with two sizes, the
    CPU per exchange between them and what that puts 1M exchanges at (both linear in exchanges)."""
    sizes = sorted(map(int, results))
    out = []
    names = dict.fromkeys(str(r["command"]) for rows in results.values() for r in rows)
    for name in names:
        for code in ("baseline", "this"):
            per = {n: [r for r in results[str(n)] if r["command"] == name and r["code"] == code] for n in sizes}
            if not all(per.values()):
                continue
            cpu = {n: sum(float(r["cpu_s"]) for r in rows) / len(rows) for n, rows in per.items()}
            anon = {n: max(float(r["anon_mb"]) for r in rows) for n, rows in per.items()}
            row: dict[str, object] = {"command": name, "code": code, **{f"cpu_s_{n}": round(cpu[n], 2) for n in sizes},
                                      **{f"anon_mb_{n}": round(anon[n]) for n in sizes}}
            if len(sizes) >= 2:
                lo, hi = sizes[0], sizes[-1]
                per_ex = (cpu[hi] - cpu[lo]) / (hi - lo)
                row["us_per_exchange"] = round(per_ex * 1e6, 1)
                row["cpu_s_1M"] = round(cpu[hi] + per_ex * (1_000_000 - hi), 1)
                row["anon_mb_1M"] = round(anon[hi] + (anon[hi] - anon[lo]) / (hi - lo) * (1_000_000 - hi))
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, required=True, help="the folder store_scale.py kept its stores in")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--baseline", default="main", help="git revision to compare against")
    ap.add_argument("--this", help="git revision measured as this code (default: the checkout as installed)")
    ap.add_argument("--this-keep", type=Path, help="where this code reads the stores instead (copies of --keep's "
                    "migrated by `nfproxy migrate`, for a format the baseline cannot read)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", help="comma-separated commands (default: all)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="nf-readers-") as tmp:
        variants = {"baseline": unpack(a.baseline, Path(tmp) / "baseline"),
                    "this": unpack(a.this, Path(tmp) / "this") if a.this else None}
        if not a.this:
            for folder in PACKAGES:
                compiled(ROOT / folder)
        for n in map(int, a.sizes.split(",")):
            cmds = {"baseline": commands(a.keep / f"s{n}.lmdb"),
                    "this": commands((a.this_keep or a.keep) / f"s{n}.lmdb")}
            for r in range(a.rounds):
                for name in cmds["this"]:
                    if a.only and name not in a.only.split(","):
                        continue
                    order = list(variants.items()) if r % 2 == 0 else list(variants.items())[::-1]
                    for variant, path in order:
                        row = {"exchanges": n, "round": r, "command": name, "code": variant,
                               "load": os.getloadavg()[0], **measure(cmds[variant][name], path)}
                        results.setdefault(str(n), []).append(row)
                        print(json.dumps(row), flush=True)
    table = summary(results)
    for row in table:
        print(json.dumps(row))
    if a.json:
        a.json.write_text(json.dumps({"runs": results, "summary": table}, indent=2))


if __name__ == "__main__":
    main()
