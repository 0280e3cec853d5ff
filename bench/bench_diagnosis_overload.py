"""The diagnosis service under a hostile load: four concurrent ~10 MiB gzip bundles that inflate to
~120 MiB each (stack texts salted with random frames so they compress only ~11x), while /healthz is
probed every 50 ms.

    .venv/bin/python bench/bench_diagnosis_overload.py [--service-python OTHER/.venv/bin/python]

Anchor: /healthz on the same service, idle, in the same run (the ratio is loaded/idle). Reported:
/healthz latency (median, max), the wall time until every bundle was answered, each answer's status,
and the peak resident memory of the service and its worker processes. `--service-python` runs the
service of another checkout (e.g. main's, before the limits) with the same load, for comparison.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench_diagnosis import start_service  # bench/ is on the path when a script here runs

from stalwart.diagnosis.corpus import load_corpus
from stalwart.processes import stop_process
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
RANKS = 16_384
DECODED_BYTES = 117 * 1024 * 1024


def hostile_bundle(seed: int = 0) -> bytes:
    """~120 MiB of bundle JSON, gzipped to ~10 MiB."""
    case = next(c for c in load_corpus(CORPUS) if c.name == "hang-t2p4d2-sleep-r5")
    base = case.bundle.stack_text(case.bundle.stacks[0])
    rng = random.Random(seed)
    per_rank = DECODED_BYTES // RANKS
    stacks = []
    for rank in range(RANKS):
        text = base
        while len(text) < per_rank:
            frame = f'\n  File "/opt/{rng.getrandbits(64):016x}.py", line {rng.randrange(9999)}, in f\n'
            text += frame + base[:120] + f" {rng.getrandbits(48):012x}"
        stacks.append({"rank": rank, "node": f"node-{rank // 8}", "text": text[:per_rank]})
    topology = {"world_size": RANKS, "tp": 2, "pp": 4, "dp": RANKS // 8}
    doc = {"job": "overload", "kind": "hang", "topology": topology, "stacks": stacks}
    return gzip.compress(json.dumps(doc).encode(), compresslevel=6)


def probe(url: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            httpx.get(f"{url}/healthz", timeout=120)
            out.append(time.perf_counter() - started)
        except httpx.HTTPError:
            out.append(float("inf"))
        time.sleep(0.05)


def summary(latencies: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(latencies), 3), "max_s": round(max(latencies), 3), "n": len(latencies)}


def run(python: str, body: bytes, concurrent: int) -> dict[str, Any]:
    proc, url = start_service(python)
    token = os.environ[DIAGNOSIS_TOKEN_ENV]
    try:
        idle: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(url, stop, idle))
        prober.start()
        time.sleep(3)
        stop.set()
        prober.join()
        service = psutil.Process(proc.pid)
        peak = [0]
        loaded: list[float] = []
        answers: list[dict[str, Any]] = []
        stop = threading.Event()

        def watch_memory() -> None:
            while not stop.is_set():
                try:
                    procs = [service, *service.children(recursive=True)]
                    peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs))
                except psutil.Error:
                    pass
                time.sleep(0.05)

        def post() -> None:
            started = time.perf_counter()
            headers = {
                "content-type": "application/json",
                "content-encoding": "gzip",
                "authorization": f"Bearer {token}",
            }
            r = httpx.post(f"{url}/v1/diagnose", content=body, headers=headers, timeout=600)
            answers.append(
                {
                    "status": r.status_code,
                    "seconds": round(time.perf_counter() - started, 1),
                    "retry_after": r.headers.get("retry-after"),
                }
            )

        helpers = [threading.Thread(target=watch_memory), threading.Thread(target=probe, args=(url, stop, loaded))]
        for t in helpers:
            t.start()
        started = time.perf_counter()
        posts = [threading.Thread(target=post) for _ in range(concurrent)]
        for t in posts:
            t.start()
        for t in posts:
            t.join()
        wall = time.perf_counter() - started
        stop.set()
        for t in helpers:
            t.join()
        idle_s, loaded_s = summary(idle), summary(loaded)
        return {
            "python": python,
            "healthz_idle": idle_s,
            "healthz_loaded": loaded_s,
            "healthz_max_ratio_loaded_to_idle": round(loaded_s["max_s"] / idle_s["max_s"], 1),
            "wall_s": round(wall, 1),
            "peak_rss_gib": round(peak[0] / (1 << 30), 2),
            "answers": sorted(answers, key=lambda a: a["seconds"]),
        }
    finally:
        stop_process(proc, grace=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service-python", default=sys.executable, help="the interpreter whose stalwart to serve")
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    body = hostile_bundle()
    print(f"bundle: {len(body) / (1 << 20):.1f} MiB gzip", file=sys.stderr)
    result = {"bundle_gzip_mib": round(len(body) / (1 << 20), 1), **run(args.service_python, body, args.concurrent)}
    result["load_average"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
