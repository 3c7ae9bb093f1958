"""Reading untrusted JSON with bounds: a size cap, a cap on the values it may hold, and nesting
that Python can read, each refused with one line naming the file and what to do.

A file small on disk can expand without limit (a compressed entry), and JSON that fits in memory
as text can take twenty times more once parsed (`[[],[],...]`), or nest deeper than the parser's
recursion. The caps keep the peak memory of any input under a few hundred megabytes.
"""

from __future__ import annotations

import codecs
import itertools
import json
from collections.abc import Iterator
from typing import IO, Any, Protocol

from noisefloor.errors import InputError, NoisefloorError

MAX_JSON_BYTES = 64 << 20  # one JSON document (a file, an archive entry, a line)
MAX_JSON_VALUES = 8_000_000  # containers and separators in one document


def read_capped(fh: IO[bytes], where: str, limit: int = MAX_JSON_BYTES,
                error: type[NoisefloorError] = InputError) -> bytes:
    """At most `limit` bytes from `fh`; more is refused (a decompression bomb or a wrong file)."""
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{where}: larger than {limit >> 20} MiB (expanded); nfanalyze refuses it as damaged or "
                    "hostile; check the file, or split it")
    return data


def loads(data: bytes | str, where: str, error: type[NoisefloorError] = InputError) -> Any:
    """`json.loads` within the caps above; every failure one line naming `where`."""
    if len(data) > MAX_JSON_BYTES:
        raise error(f"{where}: JSON document larger than {MAX_JSON_BYTES >> 20} MiB; refused as damaged or hostile")
    if isinstance(data, bytes):
        count = sum(data.count(m) for m in (b",", b"[", b"{"))
    else:
        count = sum(data.count(m) for m in (",", "[", "{"))
    if count > MAX_JSON_VALUES:
        raise error(f"{where}: JSON holding more than {MAX_JSON_VALUES:,} values; refused as damaged or hostile")
    try:
        return json.loads(data)
    except RecursionError:
        raise error(f"{where}: JSON nested too deep to read (thousands of levels); the file is damaged or "
                    "hostile") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as "
                    "UTF-8") from None
    except ValueError as exc:
        raise error(f"{where}: not valid JSON ({exc}); the file is damaged or not the kind expected") from None


MAX_LINE_BYTES = 16 << 20  # one JSON Lines record (a task with its inputs, a sample's program)
MAX_LINES_BYTES = 256 << 20  # a whole JSON Lines file, expanded


class Lines(Protocol):
    """What json_lines reads from: any binary stream with readline (a file, a gzip file, a pipe)."""

    def readline(self, size: int = -1, /) -> bytes: ...


def json_lines(fh: Lines, where: str, error: type[NoisefloorError] = InputError, line_limit: int = MAX_LINE_BYTES,
               total_limit: int = MAX_LINES_BYTES, what: str = "one JSON object per line",
               values_limit: int = MAX_JSON_VALUES) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSON Lines stream, read in bounded lines (a compressed file may
    expand without limit): UTF-8 (a BOM allowed), each line a JSON object within the caps above,
    blank lines skipped. The values of all lines together are capped too, since a reader may keep
    every line's object. Every failure is one `error` naming `where` and the line."""
    total = values = 0
    for n in itertools.count(1):
        raw = fh.readline(line_limit + 1)
        if not raw:
            return
        total += len(raw)
        if len(raw) > line_limit:
            raise error(f"{where}:{n}: line longer than {line_limit >> 20} MiB; the file is damaged or not "
                        f"the kind expected ({what})")
        if total > total_limit:
            raise error(f"{where}:{n}: more than {total_limit >> 20} MiB (expanded); refused as damaged or "
                        "hostile; split the file")
        values += raw.count(b",") + raw.count(b"[") + raw.count(b"{")
        if values > values_limit:
            raise error(f"{where}:{n}: more than {values_limit:,} JSON values in the file; refused as damaged or "
                        "hostile; split the file")
        if n == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}:{n}: byte {raw[exc.start]:#04x} at column {exc.start + 1} is not UTF-8; save "
                        "the file as UTF-8") from None
        doc = loads(text, f"{where}:{n}", error)
        if not isinstance(doc, dict):
            raise error(f"{where}:{n}: a JSON {type(doc).__name__}, not an object; expected {what}")
        yield n, doc
