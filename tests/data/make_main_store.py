"""How tests/data/store-main-1704f55 was made: run with main at 1704f55 on the import path
(PYTHONPATH pointing at a checkout of that commit laid out as the `noisefloor` package).
tests/data/store-main-0410ae8 was made the same way with main at 0410ae8 (noisefloor-log/3, the
format before the heads table), and tests/data/store-main-05ff371 with main at 05ff371
(noisefloor-log/4: heads, records whole with their ids; the format before noisefloor-log/5).
tests/data/store-main-0497a29 with main at 0497a29 (noisefloor-log/5: bodies without their CRC, the
format before noisefloor-log/6). tests/data/store-main-ac2f828 with main at ac2f828 (noisefloor-log/7:
8-byte dictionary keys and CRC-wrapped bodies, the format before noisefloor-log/8), and
tests/data/store-main-ac2f828-dicts with `--dicts` (the same, 72 more exchanges and compacted: its
values compressed with trained dictionaries). `--golden FILE` writes what that main's reader reads
from the store (tests/data/recorded/NAME.json.gz, what it must read as after `nfproxy migrate`).

One session, "S": four independent questions, a two-turn conversation whose second turn carries
the first answer, and one question asked twice (two different answers), all OpenAI chat."""

import base64
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store


def chat(messages):
    body = json.dumps({"model": "gpt-4o-mini", "messages": messages}).encode()
    return RequestData("POST", "http://127.0.0.1:9/v1/chat/completions", "127.0.0.1", "/v1/chat/completions",
                       (("content-type", "application/json"),), body)


def answer(text, n):
    doc = {"id": f"chatcmpl-{n}", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    return ResponseData(200, (("content-type", "application/json"),), json.dumps(doc).encode())


def golden(store: Path) -> dict:
    """Every record, every recorded exchange's request and answer bodies, the outcome rows."""
    def b64(data):
        return base64.b64encode(data or b"").decode()

    with Store.open(store, write=False) as s:
        return {"format": s.format, "exchanges": len(s), "outcomes": s.outcome_rows(),
                "records": [json.loads(ex.json_bytes()) for ex in s.exchanges()],
                "recorded": [{"request": ex.request, "body": b64(s.part_body(ex.request, ex.id, "request")),
                              "status": ex.response["status"], "answer": b64(s.part_body(ex.response, ex.id, "response"))}
                             for ex in s.exchanges() if ex.mode == "record" and ex.response is not None]}


def main(out: Path, dicts: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with Store.open(Path(tmp) / "s", write=True, create=True) as s:
            rec = Recorder(s, Rules())
            n = 0
            calls = [[{"role": "user", "content": f"Independent question {i}?"}] for i in range(4)]
            first = [{"role": "user", "content": "Start a story."}]
            calls.append(first)
            for messages in calls:
                n += 1
                rec.finish(rec.begin(chat(messages), Labels("S")), answer(f"recorded answer {n}", n))
                time.sleep(0.01)
            second = first + [{"role": "assistant", "content": "recorded answer 5"}, {"role": "user", "content": "Go on."}]
            for messages in (second, [{"role": "user", "content": "Pick a number."}],
                             [{"role": "user", "content": "Pick a number."}]):
                n += 1
                rec.finish(rec.begin(chat(messages), Labels("S")), answer(f"recorded answer {n}", n))
                time.sleep(0.01)
            for i in range(72 if dicts else 0):  # enough values of each kind to train a dictionary on
                n += 1
                words = " ".join(f"w{(i * 7 + j) % 97}" for j in range(40 + i % 13))
                rec.finish(rec.begin(chat([{"role": "user", "content": f"Question {i}: {words}?"}]), Labels("D")),
                           answer(f"answer {i}: {words[::-1]}", n))
            out.mkdir(parents=True)
            s.tables.copy_to(out)
    if dicts:
        from noisefloor.proxy.store import compact

        compact.rewrite(out)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--golden" in args:
        i = args.index("--golden")
        Path(args[i + 1]).write_bytes(gzip.compress(json.dumps(golden(Path(args[0])), sort_keys=True).encode(), mtime=0))
    else:
        main(Path(args[0]), "--dicts" in args)
