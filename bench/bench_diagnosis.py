"""Benchmark of the diagnosis engine at 1,024, 4,096 and 16,384 ranks, on this machine.

    .venv/bin/python bench/bench_diagnosis.py             # about 3 minutes on 2 cores
    .venv/bin/python bench/bench_diagnosis.py --quick     # 1,024 and 4,096 ranks, one repeat

1. Stack aggregation (a hang): a real captured hang (tests/data/diagnosis/corpus, TP=2 PP=4 DP=2,
   py-spy --native) grown to TP=8 PP=4 DP=N/32 with 8 ranks per node by stalwart.diagnosis.corpus_gen;
   every rank's dump is distinct (its own pid), as in production. Timed: validating the bundle from
   its JSON (what the service does first), and diagnose() on it, cold (the per-line cache emptied).
   The anchor, in the same run: the same grouping with no caching, every dump parsed and classified
   on its own.
   Over HTTP too (--http, on by default): the service in its own process on loopback, the client
   gzipping the bundle; timed from the client's call to the verdict in hand.
2. Metric outliers (a slowdown): the real per-step series of a captured slow run, grown to N/8 nodes
   (one series per node of 8 GPUs) and to N series (one per rank). Timed: diagnose(kind=metrics).
   The anchor: the same sliding-window robust z-scores in plain Python (statistics.median).

Every figure is the median of the repeats; each case also checks that the verdict names the right
machine. Prints a table and writes the numbers as JSON (--out).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
HANG_CASE = "hang-t2p4d2-sleep-r5"
SLOW_CASE = "slow-t2p2d2-sleep-r5"

from stalwart.diagnosis import (  # noqa: E402
    EvidenceBundle,
    diagnose,
    stack_parse,
)
from stalwart.diagnosis.corpus import CorpusCase, load_corpus  # noqa: E402
from stalwart.diagnosis.corpus_gen import expand_hang, expand_metrics  # noqa: E402
from stalwart.diagnosis.metric_outliers import DIRECTIONS, OutlierConfig  # noqa: E402
from stalwart.diagnosis.stack_state import classify  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int, before: Callable[[], None] = lambda: None) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def cold() -> None:
    stack_parse._pyspy_frame.cache_clear()
    stack_parse._fh_frame.cache_clear()


# ------------------------------------------------------------------------------------------ anchors
def naive_aggregate(texts: list[str]) -> dict[tuple[str, ...], list[int]]:
    """Every dump parsed and classified on its own: no text cache, no line cache."""
    pyspy, fh = stack_parse._pyspy_frame.__wrapped__, stack_parse._fh_frame.__wrapped__
    saved = stack_parse._pyspy_frame, stack_parse._fh_frame
    stack_parse._pyspy_frame, stack_parse._fh_frame = pyspy, fh  # type: ignore[assignment]
    try:
        groups: dict[tuple[str, ...], list[int]] = {}
        for rank, text in enumerate(texts):
            parsed = stack_parse._parse(text)
            classify(parsed)
            groups.setdefault(parsed.frames, []).append(rank)
        return groups
    finally:
        stack_parse._pyspy_frame, stack_parse._fh_frame = saved  # type: ignore[assignment]


def naive_metric_outliers(bundle: EvidenceBundle, cfg: OutlierConfig) -> set[str]:
    """The same windows, medians, MAD z-scores and persistence, in plain Python."""
    flagged: set[str] = set()
    names = sorted({k for m in bundle.metrics for k in m.series})
    for name in names:
        direction = DIRECTIONS.get(name, "both")
        rows = [[v for v in (m.series.get(name) or []) if v is not None] for m in bundle.metrics]
        length = min(len(r) for r in rows)
        wins = [
            [statistics.median(r[j : j + cfg.window]) for j in range(0, length - cfg.window + 1, cfg.stride)]
            for r in rows
        ]
        runs = [0] * len(rows)
        for j in range(len(wins[0]) if wins else 0):
            col = [w[j] for w in wins]
            med = statistics.median(col)
            mad = statistics.median(abs(v - med) for v in col)
            floor = max(0.1 * abs(med), 1e-9)
            scale = max(1.4826 * mad, floor / 3)
            for i, v in enumerate(col):
                dev = v - med if direction == "high" else med - v if direction == "low" else abs(v - med)
                runs[i] = runs[i] + 1 if dev / scale >= cfg.z_threshold and dev >= floor else 0
                if runs[i] >= cfg.persist:
                    flagged.add(bundle.metrics[i].node)
    return flagged


# ------------------------------------------------------------------------------------------- cases
def start_service(python: str = sys.executable) -> tuple[Any, str]:
    """The service of `python`'s stalwart on a free loopback port, with the token in this process's
    STALWART_DIAGNOSIS_TOKEN (made if unset): the service reads it, and so does the client."""
    import httpx

    from stalwart.net import free_port
    from stalwart.processes import spawn, wait_for
    from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, new_token

    os.environ.setdefault(DIAGNOSIS_TOKEN_ENV, new_token())
    port = free_port()
    argv = [python, "-m", "stalwart.diagnosis.service", "--host", "127.0.0.1", "--port", str(port)]
    proc = spawn(argv, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    if not wait_for(up, 120, 0.2) or proc.poll() is not None:
        raise RuntimeError("the diagnosis service did not start")
    return proc, url


def bench_stacks(case: CorpusCase, ranks: int, repeats: int, url: str | None = None) -> dict[str, Any]:
    grown = expand_hang(case, tp=8, dp=ranks // 32, ranks_per_node=8)
    body = grown.bundle.model_dump_json().encode()
    validate_s, bundle = timed(lambda: EvidenceBundle.model_validate_json(body), repeats)
    diagnose_s, verdict = timed(lambda: diagnose(bundle), repeats, before=cold)
    texts = [bundle.stack_text(s) for s in bundle.stacks]
    anchor_s, _ = timed(lambda: naive_aggregate(texts), max(1, repeats - 1))
    http: dict[str, Any] = {}
    if url:
        from stalwart.diagnosis.client import DiagnosisClient

        client = DiagnosisClient(url, timeout=120)
        http_s, remote = timed(lambda: client.diagnose(bundle), repeats)
        http = {"http_s": round(http_s, 3), "http_correct": remote.flagged == grown.truth.faulty_nodes}
    return {
        "ranks": ranks,
        "nodes": ranks // 8,
        "distinct_texts": len(set(texts)),
        "json_mib": round(len(body) / 2**20, 1),
        "gzip_mib": round(len(gzip.compress(body, 3)) / 2**20, 2),
        "validate_s": round(validate_s, 3),
        "diagnose_s": round(diagnose_s, 3),
        "total_s": round(validate_s + diagnose_s, 3),
        "anchor_s": round(anchor_s, 3),
        "anchor_ratio": round(anchor_s / diagnose_s, 1),
        "correct": verdict.flagged == grown.truth.faulty_nodes,
        "flagged": verdict.flagged,
        **http,
    }


def bench_metrics(case: CorpusCase, series: int, per: str, repeats: int) -> dict[str, Any]:
    grown = expand_metrics(case, series, seed=series)
    body = grown.bundle.model_dump_json().encode()
    validate_s, bundle = timed(lambda: EvidenceBundle.model_validate_json(body), repeats)
    diagnose_s, verdict = timed(lambda: diagnose(bundle), repeats)
    anchor_s, anchor = timed(lambda: naive_metric_outliers(bundle, OutlierConfig()), 1)
    samples = max(len(v) for m in bundle.metrics for v in m.series.values())
    return {
        "series_per": per,
        "series": series,
        "metrics": len(bundle.metrics[0].series),
        "samples": samples,
        "validate_s": round(validate_s, 3),
        "diagnose_s": round(diagnose_s, 3),
        "total_s": round(validate_s + diagnose_s, 3),
        "anchor_s": round(anchor_s, 3),
        "anchor_ratio": round(anchor_s / diagnose_s, 1),
        "anchor_agrees": sorted(anchor) == verdict.flagged,
        "correct": verdict.flagged == grown.truth.faulty_nodes,
        "flagged": verdict.flagged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--no-http", action="store_true", help="skip the round trips through the HTTP service")
    args = parser.parse_args()
    sizes = (1024, 4096) if args.quick else (1024, 4096, 16384)
    repeats = 1 if args.quick else args.repeats
    cases = {c.name: c for c in load_corpus(CORPUS)}
    stacks, metrics = [], []
    proc, url = (None, None) if args.no_http else start_service()
    try:
        for n in sizes:
            stacks.append(bench_stacks(cases[HANG_CASE], n, repeats, url))
            print(f"stacks  {n:6d} ranks: {json.dumps(stacks[-1])}", flush=True)
    finally:
        if proc is not None:
            from stalwart.processes import stop_process

            stop_process(proc, grace=10)
    for n in sizes:
        for per, count in (("node", n // 8), ("rank", n)):
            metrics.append(bench_metrics(cases[SLOW_CASE], count, per, repeats))
            print(f"metrics {n:6d} ranks, per {per}: {json.dumps(metrics[-1])}", flush=True)
    load = os.getloadavg()
    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    env = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": [round(x, 1) for x in load],
        "command": command,
    }
    print(
        "\nstack aggregation (hang)        ranks  distinct  JSON MiB  gzip MiB  validate  diagnose  total   "
        "anchor  ratio  HTTP    right"
    )
    for r in stacks:
        http = f"{r['http_s']:5.2f}s" if "http_s" in r else "   - "
        print(
            f"{'':32}{r['ranks']:6d}  {r['distinct_texts']:8d}  {r['json_mib']:8.1f}  {r['gzip_mib']:8.2f}  "
            f"{r['validate_s']:7.2f}s  {r['diagnose_s']:7.2f}s  {r['total_s']:5.2f}s  {r['anchor_s']:6.2f}s  "
            f"{r['anchor_ratio']:4.1f}x  {http}  {r['correct'] and r.get('http_correct', True)}"
        )
    print("\nmetric outliers (slowdown)      ranks  series  samples  validate  diagnose  total   anchor  ratio  right")
    for r, n in zip(metrics, [s for s in sizes for _ in (0, 1)], strict=True):
        print(
            f"{'':32}{n:6d}  {r['series']:6d}/{r['series_per']:4}  {r['samples']:4d}  {r['validate_s']:7.2f}s  "
            f"{r['diagnose_s']:7.2f}s  {r['total_s']:5.2f}s  {r['anchor_s']:6.2f}s  {r['anchor_ratio']:5.1f}x  "
            f"{r['correct']}"
        )
    print(f"\n{env}")
    if args.out:
        args.out.write_text(json.dumps({"env": env, "stacks": stacks, "metrics": metrics}, indent=1) + "\n")


if __name__ == "__main__":
    main()
