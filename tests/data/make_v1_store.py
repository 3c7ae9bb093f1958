"""Writes tests/data/v1_store.lmdb with main's code as of commit 1704f55 (store format
noisefloor-log/1), through the real recorder and replayer: the fixture that proves stores written
before the versioned format still open, replay and migrate. Kept for the record; rerunning it
with today's code writes today's format instead."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.replay.replayer import Replayer
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store


def chat(content: str, stream: bool = False) -> RequestData:
    body = json.dumps({"model": "gpt-4o-mini", "stream": stream,
                       "messages": [{"role": "user", "content": content}]}).encode()
    return RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions",
                       (("content-type", "application/json"), ("authorization", "Bearer sk-test-secret")), body)


def answer(text: str) -> ResponseData:
    body = json.dumps({"id": "c1", "object": "chat.completion", "model": "gpt-4o-mini-2024", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3}}).encode()
    return ResponseData(200, (("content-type", "application/json"),), body)


def stream(text: str) -> ResponseData:
    events = [json.dumps({"choices": [{"index": 0, "delta": {"content": w + " "}}]}) for w in text.split()]
    body = b"".join(b"data: " + e.encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return ResponseData(200, (("content-type", "text/event-stream"),), body,
                        layout=tuple((float(i), len(body) // len(events)) for i in range(len(events) - 1))
                        + ((float(len(events)), len(body) - (len(body) // len(events)) * (len(events) - 1)),))


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.lmdb"
        with Store.open(path, write=True, create=True) as s:
            rec = Recorder(s, Rules())
            for session, task in (("sA", "t1"), ("sB", "t2")):
                labels = Labels(session, task, "0", "live")
                rec.finish(rec.begin(chat(f"what is 2+2 ({session})"), labels), answer("4"))
                rec.finish(rec.begin(chat("say hello", stream=True), labels), stream("hello there friend"))
                rec.finish(rec.begin(chat("what is 2+2 again"), labels), answer("four"))
            rec.finish(rec.begin(chat("unreachable"), Labels("sC")), None, error="ConnectError: refused")
            rep = Replayer(s, Rules())
            rep.answer(chat("what is 2+2 (sA)"), Labels("r1", condition="replay"))
            rep.answer(chat("never recorded"), Labels("r1", condition="replay"))
            s.outcomes.put([{"task_id": "t1", "condition": "live", "replicate": "0", "outcome": 1}])
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            s.tables.copy_to(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "v1_store.lmdb")
