"""What a proxy run counts, and the one-line exit summary made of it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counts for the exit summary."""

    exchanges: int = 0
    hits: int = 0
    misses: int = 0
    order_violations: int = 0
    order_notes: int = 0  # replay: answered as recorded, asked in another order than recorded
    errors: int = 0
    unrecorded: int = 0  # record mode: exchanges the store does not hold (the recording is incomplete)
    unwritten: int = 0  # record mode: answered exchanges kept only as their answered rows (`nfproxy repair`)
    tls_failures: int = 0
    upstream_errors: dict[int, int] = field(default_factory=dict)

    def lost(self) -> None:
        self.errors += 1
        self.unrecorded += 1

    def summary(self, mode: str, store: str) -> str:
        parts = [
            f"nfproxy {mode}: {self.exchanges} exchanges",
            f"{self.errors} errors",
        ]
        if self.unrecorded:
            parts.append(f"{self.unrecorded} exchanges NOT recorded")
        if self.unwritten:
            parts.append(f"{self.unwritten} answered exchanges kept but NOT written: run `nfproxy repair "
                         f"{store}`")
        if mode == "replay":
            parts[1:1] = [f"{self.hits} hits", f"{self.misses} misses", f"{self.order_violations} order violations"]
            parts.append(f"{self.order_notes} order notes")
        if self.upstream_errors:
            statuses = ", ".join(f"{n}x{s}" for s, n in sorted(self.upstream_errors.items()))
            parts.append(f"upstream error statuses: {statuses}")
        return ", ".join(parts) + f" (store {store})"
