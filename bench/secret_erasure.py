"""What the secret rule costs per body: the full check (every spelling, every 20-character run,
escapes undone) against the whole-value scan it replaced, interleaved round by round.

    python bench/secret_erasure.py --rounds 10
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time

from noisefloor.proxy.request import secrets

TEXT = "The quick brown fox jumps over the lazy dog; def add(a, b): return a + b. 100% sure \u4e2d. "


def bodies() -> dict[str, bytes]:
    chat = json.dumps({"messages": [{"role": "user", "content": TEXT * 120}]}).encode()
    return {"10 kB chat": chat, "1 MB chat": chat * 100,
            "130 kB base64 image": json.dumps({"image": base64.b64encode(os.urandom(100_000)).decode()}).encode()}


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    key = "sk-proj-" + base64.urlsafe_b64encode(os.urandom(120)).decode()[:156]  # an OpenAI project key's shape
    values = secrets.secret_values("https://api.openai.com/v1/chat/completions", [("authorization", f"Bearer {key}")])
    old = [v.encode() for v in values]
    b64 = {f for v in values for f in secrets._base64_forms(v.encode())}
    no_b64 = [v for v in values if v not in b64]  # the rule before the base64 spellings were added
    for name, body in bodies().items():
        n = max(3, 2_000_000 // len(body))
        new_t, old_t, pre_t = [], [], []
        for _ in range(args.rounds):
            new_t.append(per_call_us(lambda b=body: secrets.contains(b, values), n))
            old_t.append(per_call_us(lambda b=body: any(v in b for v in old), n))
            pre_t.append(per_call_us(lambda b=body: secrets.contains(b, no_b64), n))
        ratio = statistics.median(a / b for a, b in zip(new_t, old_t))
        b64_ratio = statistics.median(a / b for a, b in zip(new_t, pre_t))
        print(f"{name}: rule {statistics.median(new_t):.0f} us, whole-value scan {statistics.median(old_t):.0f} us, "
              f"ratio {ratio:.2f}; rule without the base64 spellings {statistics.median(pre_t):.0f} us, "
              f"ratio {b64_ratio:.2f}")


if __name__ == "__main__":
    main()
