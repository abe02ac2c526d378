"""The device scripts' summary: one row per check (PASS / FAIL / SKIP and what was measured), printed
as it is added and as one table at the end."""

from __future__ import annotations


class Summary:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, check: str, ok: bool | None, detail: str) -> None:
        verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.rows.append((check, verdict, detail))
        print(f"[{verdict}] {check}: {detail}", flush=True)

    def print(self) -> int:
        """The table; 1 if any check failed."""
        width = max(len(c) for c, _, _ in self.rows)
        print("\n| check | result | measured |\n|---|---|---|")
        for check, verdict, detail in self.rows:
            print(f"| {check:<{width}} | {verdict} | {detail} |")
        return 1 if any(v == "FAIL" for _, v, _ in self.rows) else 0
