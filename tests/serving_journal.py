"""Serving journal lines as the console records them, for the compare table's tests: a scrape,
two drafters served and scraped, and the table's rows over lines as the journal's parsers read
them."""

from __future__ import annotations

from typing import Any

from console.checkpoints.compare import rows
from console.checkpoints.journal import Session, SwapRecord, measurement, record


def record_session(d: dict[str, Any]) -> None:
    """Record a session given as a journal line (as an older console may have written it)."""
    s = Session.parse(d)
    assert s is not None, d
    record(s)


def record_swap(d: dict[str, Any]) -> None:
    s = SwapRecord.parse(d)
    assert s is not None, d
    record(s)


def record_scrape(run_id: str, d: dict[str, Any]) -> None:
    """Record a scrape or a replay (a `metrics --json` object or a bench line) under a run."""
    m = measurement({**d, "run_id": run_id})
    assert m is not None, d
    record(m)


def scrape(t: float, series: int, drafts: int, accepted: int, pos: list[float],
           host: str = "box", url: str = "http://127.0.0.1:8000/metrics", **kw: Any
           ) -> dict[str, Any]:
    total = {"drafts": drafts, "accepted": accepted, "acceptance_length": 1 + accepted / drafts,
             "per_position": pos, "generation_tokens_per_s": kw.get("tps"),
             "seconds": kw.get("seconds")}
    return {"host": host, "url": url, "t": t, "series": series, "total": total}


def parsed_rows(sessions: list[dict[str, Any]], scrapes: list[dict[str, Any]],
                swaps: tuple[dict[str, Any], ...] = ()) -> list[Any]:
    """rows() of journal lines as the journal's parsers read them."""
    return rows([s for d in sessions if (s := Session.parse(d))],
                [s for d in scrapes if (s := measurement(d))],
                [s for d in swaps if (s := SwapRecord.parse(d))])


def two_served_drafters(url: str, t0: float) -> None:
    """The public drafter, then a finetune of it, served and scraped 10 minutes each (recorded in
    the current registry root)."""
    record_session({"run_id": "serve-public-1", "host": "local", "drafter": "/models/public-eagle3",
                    "k": 3, "metrics": url, "started": t0, "provenance": {}})
    record_session({"run_id": "serve-ft-final-1", "host": "local", "k": 3, "metrics": url,
                    "drafter": "/srv/eagle3/runs/finetune-20261130/out/final", "started": t0 + 900,
                    "provenance": {"run": "/srv/eagle3/runs/finetune-20261130", "step": 150,
                                   "finetune": {"path": "/models/public-eagle3"}}})
    record_scrape("serve-public-1", scrape(t0 + 600, 1, 2000, 2520, [0.62, 0.41, 0.23],
                                           url=url, seconds=600.0, tps=812.5))
    record_scrape("serve-ft-final-1", scrape(t0 + 1500, 1, 2000, 3880, [0.87, 0.63, 0.44],
                                             url=url, seconds=600.0, tps=1093.0))
