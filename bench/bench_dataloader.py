"""Benchmark of stalwart.dataloader against torchdata's StatefulDataLoader, in one run, on this machine.

    .venv/bin/python bench/bench_dataloader.py            # about 2 minutes on 2 cores
    .venv/bin/python bench/bench_dataloader.py --quick    # smaller repeats, for a smoke run

1. Resume cost: time from "a restarted trainer has its checkpoint" to "it holds its first batch", at
   global positions 10^3, 10^5 and 10^7 samples. Ours: a fresh in-process loader (opens the shards,
   loads the state, computes the batch); the shadow loader's client with the loader running but not
   prefilled (cold); and with the loader prefilled from the state (a restart or a warm standby). The
   anchor, configured as a competent user would: StatefulDataLoader over the same shards as a weighted
   mixture stream that is a stateful IterableDataset (its state_dict is a few counters: each source's
   epoch and cursor and the mixing generator's state, so it resumes in constant time, like ours); and
   over a map-style dataset with its stateful RandomSampler (which skips sampler indices on resume).
2. Throughput: samples/s of both loaders against the tiny GPT's consumption (examples/pretrain_tiny.py,
   batch 8 x seq 64 per rank, one core per rank as under 2-rank DDP on this 2-core machine), and the
   shadow loader's CPU and memory while it keeps pace with that trainer.

Prints a table and writes every number (with what was measured and what was extrapolated) as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from stalwart.dataloader import (
    DataConfig,
    DeterministicLoader,
    ShadowLoaderClient,
    ShadowLoaderSupervisor,
    SourceSpec,
    TokenDataset,
    build_shards,
)
from stalwart.dataloader.shm_layout import A, C, S
from stalwart.dataloader.sources import TokenSource
from stalwart.dataloader.state import state_at

REPO = Path(__file__).resolve().parent.parent
SEQ_LEN, MICRO_BATCH = 64, 8
POSITIONS = (10**3, 10**5, 10**7)
WEIGHTS = {"prose": 0.5, "code": 0.3, "numbers": 0.2}


# ------------------------------------------------------------------------------------- corpus
def make_corpus(root: Path, tokens_per_source: int) -> DataConfig:
    """Three generated sources of about tokens_per_source byte tokens each, built into shards."""
    rng = random.Random(0)
    words = "model node rank step loss shard epoch token batch seed worker restart checkpoint trains fails recovers "
    words += "waits learns quickly slowly again"
    words = words.split()
    makers: dict[str, Callable[[], str]] = {
        "prose": lambda: " ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) + ".",
        "code": lambda: f"def f{rng.randint(0, 9999)}(x): return x * {rng.randint(2, 99)} + {rng.randint(0, 9)}",
        "numbers": lambda: f"{rng.randint(0, 9999)} + {rng.randint(0, 9999)} = {rng.randint(0, 19999)}",
    }
    for name, make in makers.items():
        text_path = root / f"{name}.txt"
        with open(text_path, "w") as f:
            written = 0
            while written < tokens_per_source:
                line = make() + "\n"
                f.write(line)
                written += len(line)
        build_shards([text_path], root / name, shard_tokens=1 << 20, doc_per="line")
    return DataConfig(
        sources=[SourceSpec(name=n, shards=[str(root / n / "*.stok")]) for n in makers],
        weights=WEIGHTS,
        seq_len=SEQ_LEN,
        seed=1234,
    )


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------- the anchor
class StatefulMixtureStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The anchor's mixture, written as a competent user would for StatefulDataLoader: a weighted
    random stream over the same shards and windows, each source shuffled per epoch, whose state is a
    few counters (each source's epoch and cursor, the mixing generator's state). Resuming regenerates
    the current epochs' permutations and restores the generator: constant in the position."""

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self.sources = [TokenSource(s.name, s.resolve(), config.seq_len) for s in config.sources]
        weights = np.array([config.weights[s.name] for s in self.sources], dtype=np.float64)
        self.cdf = np.cumsum(weights / weights.sum())
        self.sizes = [s.num_samples for s in self.sources]
        self.rng = np.random.default_rng(config.seed)
        self.epochs = [0] * len(self.sources)
        self.cursors = [0] * len(self.sources)
        self.orders: list[np.ndarray | None] = [None] * len(self.sources)
        self.out = np.empty(config.seq_len + 1, dtype=np.int64)

    def _order(self, s: int) -> np.ndarray:
        order = self.orders[s]
        if order is None:
            order = self.orders[s] = np.random.default_rng([self.config.seed, s, self.epochs[s]]).permutation(
                self.sizes[s]
            )
        return order

    def __iter__(self) -> StatefulMixtureStream:
        return self

    def __next__(self) -> torch.Tensor:
        s = min(int(np.searchsorted(self.cdf, self.rng.random(), side="right")), len(self.sources) - 1)
        self.sources[s].read(int(self._order(s)[self.cursors[s]]), self.out)
        self.cursors[s] += 1
        if self.cursors[s] == self.sizes[s]:
            self.epochs[s], self.cursors[s], self.orders[s] = self.epochs[s] + 1, 0, None
        return torch.from_numpy(self.out.copy())

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": list(self.epochs), "cursors": list(self.cursors), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs, self.cursors = list(state["epochs"]), list(state["cursors"])
        self.orders = [None] * len(self.sources)
        self.rng.bit_generator.state = state["rng"]

    def state_at(self, position: int) -> dict[str, Any]:
        """The state after `position` samples, computed as the stream would reach it (the same
        draws, in bulk): a position of 10^7 without yielding 10^7 samples."""
        rng = np.random.default_rng(self.config.seed)
        counts = np.zeros(len(self.sources), dtype=np.int64)
        for start in range(0, position, 1 << 22):
            picks = np.searchsorted(self.cdf, rng.random(min(1 << 22, position - start)), side="right")
            counts += np.bincount(np.minimum(picks, len(self.sources) - 1), minlength=len(self.sources))
        return {
            "epochs": [int(c // n) for c, n in zip(counts, self.sizes, strict=True)],
            "cursors": [int(c % n) for c, n in zip(counts, self.sizes, strict=True)],
            "rng": rng.bit_generator.state,
        }


class VirtualIndexDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style: index i -> window i mod N of the concatenated sources, with a length of 1.2 * 10^7 so
    that 10^7 samples are inside one epoch of StatefulDataLoader's RandomSampler. On resume the sampler
    draws the epoch's permutation again (O(dataset length)) and skips the indices already yielded
    (O(position)), without fetching samples: StatefulDataLoader's cheapest fast-forward."""

    def __init__(self, dataset: TokenDataset) -> None:
        self.sources = dataset.sources
        self.sizes = np.cumsum([0] + [s.num_samples for s in self.sources])
        self.tokens = dataset.sample_tokens

    def __len__(self) -> int:
        return 12 * 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        j = i % int(self.sizes[-1])
        s = int(np.searchsorted(self.sizes, j, side="right") - 1)
        out = np.empty(self.tokens, dtype=np.int64)
        self.sources[s].read(j - int(self.sizes[s]), out)
        return torch.from_numpy(out)


def sdl_stream_state(config: DataConfig, position: int) -> dict[str, Any]:
    """StatefulDataLoader's state at `position` samples over the stateful stream: a real state after
    one batch, with the stream's counters and its loader counters set to the position."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(StatefulMixtureStream(config), batch_size=MICRO_BATCH, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    state["_num_yielded"] = state["_sampler_iter_yielded"] = position // MICRO_BATCH
    state["_sampler_iter_state"]["samples_yielded"] = position // MICRO_BATCH * MICRO_BATCH
    state["fetcher_state"]["dataset_iter_state"] = StatefulMixtureStream(config).state_at(position)
    return state


def check_stream_state(config: DataConfig, batches: int = 125) -> bool:
    """The computed state equals the one StatefulDataLoader saves after `batches` real batches, and
    a resume from it yields the batch the original run yielded next."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(StatefulMixtureStream(config), batch_size=MICRO_BATCH, num_workers=0)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    real = loader.state_dict()
    expected = next(it)
    computed = sdl_stream_state(config, batches * MICRO_BATCH)
    again = StatefulDataLoader(StatefulMixtureStream(config), batch_size=MICRO_BATCH, num_workers=0)
    again.load_state_dict(computed)
    same_state = json.dumps(real, sort_keys=True, default=str) == json.dumps(computed, sort_keys=True, default=str)
    return same_state and bool(torch.equal(next(iter(again)), expected))


def sdl_stream_resume(config: DataConfig, position: int, repeats: int) -> float:
    """A fresh StatefulDataLoader over a fresh stream (opens the shards), load_state_dict, first batch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    state = sdl_stream_state(config, position)

    def resume() -> torch.Tensor:
        again = StatefulDataLoader(StatefulMixtureStream(config), batch_size=MICRO_BATCH, num_workers=0)
        again.load_state_dict(state)
        return next(iter(again))

    resume()  # warm-up
    return median_time(resume, repeats)


def sdl_map_resume(dataset: TokenDataset, position: int, repeats: int) -> dict[str, Any]:
    """StatefulDataLoader over VirtualIndexDataset with shuffle: the state's counters are set to
    position samples (checked against a real state at the smallest position), then resume."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = VirtualIndexDataset(dataset)

    def fresh() -> StatefulDataLoader:
        torch.manual_seed(0)
        return StatefulDataLoader(ds, batch_size=MICRO_BATCH, shuffle=True, num_workers=0)

    loader = fresh()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    batches = position // MICRO_BATCH
    state["_sampler_iter_state"]["samples_yielded"] = batches * MICRO_BATCH
    state["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = batches * MICRO_BATCH
    state["_sampler_iter_yielded"] = state["_num_yielded"] = batches

    def resume() -> torch.Tensor:
        again = fresh()
        again.load_state_dict(state)
        return next(iter(again))

    return {"resume_s": median_time(resume, repeats), "measured": True, "state": "counters set to the position"}


def check_map_state_patch(dataset: TokenDataset) -> bool:
    """The patched state equals the state StatefulDataLoader itself saves after 125 real batches."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = VirtualIndexDataset(dataset)
    torch.manual_seed(0)
    loader = StatefulDataLoader(ds, batch_size=MICRO_BATCH, shuffle=True, num_workers=0)
    it = iter(loader)
    for _ in range(125):
        next(it)
    real = loader.state_dict()
    torch.manual_seed(0)
    loader = StatefulDataLoader(ds, batch_size=MICRO_BATCH, shuffle=True, num_workers=0)
    it = iter(loader)
    next(it)
    patched = loader.state_dict()
    patched["_sampler_iter_state"]["samples_yielded"] = 1000
    patched["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = 1000
    patched["_sampler_iter_yielded"] = patched["_num_yielded"] = 125
    return torch.equal(
        real["_sampler_iter_state"]["sampler_iter_state"]["generator"],
        patched["_sampler_iter_state"]["sampler_iter_state"]["generator"],
    ) and {k: v for k, v in real.items() if k != "_sampler_iter_state"} == {
        k: v for k, v in patched.items() if k != "_sampler_iter_state"
    }


# -------------------------------------------------------------------------------- ours: resume
def ours_resume(config: DataConfig, dataset: TokenDataset, repeats: int) -> dict[int, float]:
    """A fresh in-process loader per restart; positions interleaved round by round after a warm-up."""
    states = {p: state_at(dataset, p).model_dump() for p in POSITIONS}
    times: dict[int, list[float]] = {p: [] for p in POSITIONS}

    def resume(position: int) -> float:
        t0 = time.perf_counter()
        loader = DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH)
        loader.load_state_dict(states[position])
        loader.next_batch()
        elapsed = time.perf_counter() - t0
        loader.close()
        return elapsed

    for position in POSITIONS:  # warm-up: page cache, first-call costs
        resume(position)
    for _ in range(repeats):
        for position in POSITIONS:
            times[position].append(resume(position))
    return {p: statistics.median(t) for p, t in times.items()}


def lane_prefilled(sup: ShadowLoaderSupervisor, position: int) -> bool:
    lane = sup.segment.lanes[0]  # type: ignore[union-attr]
    gen = int(lane.ctrl[A.GEN])
    full = all(int(s.header[S.GEN]) == gen and int(s.header[S.STATUS]) == S.READY for s in lane.slots)
    return int(lane.ctrl[A.OWNER_PID]) == 0 and int(lane.ctrl[A.POSITION]) == position and full


def lane_released(sup: ShadowLoaderSupervisor) -> bool:
    c = sup.segment.lanes[0].ctrl  # type: ignore[union-attr]
    return int(c[A.HANDLED_SEQ]) == int(c[C.REQ_SEQ]) and int(c[A.OWNER_PID]) == 0


def shadow_resume(
    sup: ShadowLoaderSupervisor, dataset: TokenDataset, position: int, repeats: int, prewarm: bool
) -> tuple[float, int]:
    """Client attach + load_state_dict + first batch. Returns (median seconds, adopted count)."""
    state = state_at(dataset, position).model_dump()
    times, adopted = [], 0
    for _ in range(repeats):
        if prewarm:
            sup.prewarm(state, dp_size=1, micro_batch=MICRO_BATCH)
            deadline = time.monotonic() + 30
            while not lane_prefilled(sup, position) and time.monotonic() < deadline:
                time.sleep(0.005)
        else:  # move the lane somewhere else first, so the request finds nothing prepared
            sup.prewarm(state_at(dataset, position + 5000).model_dump(), dp_size=1, micro_batch=MICRO_BATCH)
            time.sleep(0.05)
        t0 = time.perf_counter()
        client = ShadowLoaderClient(sup.name, lane=0, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH, config=sup.config)
        client.load_state_dict(state)
        client.next_batch()
        times.append(time.perf_counter() - t0)
        adopted += client.stats.adopted
        client.close()
        deadline = time.monotonic() + 30  # the loader has handled the request and seen it released
        while not lane_released(sup) and time.monotonic() < deadline:
            time.sleep(0.005)
    return statistics.median(times), adopted


# ---------------------------------------------------------------------------------- throughput
def trainer_step_time(steps: int) -> float:
    """Seconds per step of examples/pretrain_tiny.py's TinyGPT, batch 8 x seq 64, on one core."""
    spec = importlib.util.spec_from_file_location("pretrain_tiny", REPO / "examples" / "pretrain_tiny.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = module.TinyGPT(vocab=257, seq=SEQ_LEN)
        optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = torch.randint(0, 257, (MICRO_BATCH, SEQ_LEN + 1))

        def step() -> None:
            logits = model(data[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), data[:, 1:].reshape(-1))
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()

        for _ in range(3):
            step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps
    finally:
        torch.set_num_threads(threads)


def inprocess_throughput(config: DataConfig, batches: int) -> dict[str, float]:
    loader = DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH)
    loader.load_state_dict(state_at(loader.dataset, 5_000_000).model_dump())
    loader.next_batch()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        loader.next_batch()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    loader.close()
    return {"samples_per_s": batches * MICRO_BATCH / wall, "cpu_s_per_batch": cpu / batches}


def shadow_throughput(sup: ShadowLoaderSupervisor, batches: int) -> dict[str, float]:
    client = ShadowLoaderClient(sup.name, lane=0, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH, config=sup.config)
    client.load_state_dict(client.state().model_copy(update={"position": 0}))
    client.next_batch()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        client.next_batch()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "samples_per_s": batches * MICRO_BATCH / wall,
        "client_cpu_s_per_batch": cpu / batches,
        "local_fallbacks": client.stats.local,
    }
    client.close()
    return out


def inprocess_paced(config: DataConfig, step_s: float, steps: int) -> float:
    """Seconds per batch of the in-process loader when the trainer takes one batch per step_s: the same
    pacing as shadow_paced, so caches are as cold between batches as in training."""
    loader = DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH)
    loader.next_batch()
    spent = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        loader.next_batch()
        spent += time.perf_counter() - t0
        time.sleep(step_s)
    loader.close()
    return spent / steps


def shadow_paced(sup: ShadowLoaderSupervisor, step_s: float, seconds: float) -> dict[str, float]:
    """The trainer takes a batch every step_s (sleeping in place of the step); what does the loader cost?"""
    proc = psutil.Process(sup.loader_pid)
    client = ShadowLoaderClient(sup.name, lane=0, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH, config=sup.config)
    client.next_batch()
    time.sleep(0.2)
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
    client_wait = 0.0
    steps = 0
    while time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        client.next_batch()
        client_wait += time.perf_counter() - w0
        steps += 1
        time.sleep(step_s)
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    mem = proc.memory_full_info()
    out = {
        "steps": steps,
        "loader_cpu_percent_of_one_core": 100 * cpu / wall,
        "loader_rss_mib": mem.rss / 2**20,
        "loader_uss_mib": mem.uss / 2**20,
        "client_s_per_batch": client_wait / steps,
        "ready_on_arrival_fraction": client.stats.ready_on_arrival / max(1, client.stats.shadow),
        "shm_segment_kib": os.path.getsize(sup.segment.path) / 1024,
    }  # type: ignore[union-attr]
    client.close()
    return out


def shadow_idle(sup: ShadowLoaderSupervisor, seconds: float) -> dict[str, float]:
    """What the loader costs between steps, when its ring is full and no trainer asks: most of a
    node's time in a job whose step is longer than the loader's refill."""
    proc = psutil.Process(sup.loader_pid)
    client = ShadowLoaderClient(sup.name, lane=0, dp_rank=0, dp_size=1, micro_batch=MICRO_BATCH, config=sup.config)
    client.next_batch()
    time.sleep(0.5)  # the ring refills
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    out = {"seconds": wall, "loader_cpu_percent_of_one_core": 100 * (sum(proc.cpu_times()[:2]) - cpu0) / wall}
    client.close()
    return out


# ---------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".stalwart" / "bench" / "dataloader.json")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--tokens-per-source", type=int, default=4_000_000)
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    results: dict[str, Any] = {
        "machine": {
            "cpus": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "processor": platform.processor() or platform.machine(),
        },
        "setup": {"seq_len": SEQ_LEN, "micro_batch": MICRO_BATCH, "weights": WEIGHTS},
    }
    try:
        import torchdata

        results["machine"]["torchdata"] = torchdata.__version__
        have_sdl = True
    except ImportError:
        have_sdl = False
        print("torchdata is not installed: the StatefulDataLoader anchor is skipped (pip install torchdata==0.11.0)")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        config = make_corpus(Path(tmp), args.tokens_per_source)
        dataset = TokenDataset(config)
        results["setup"]["build_s"] = time.perf_counter() - t0
        results["setup"]["samples_per_source"] = {s.name: s.num_samples for s in dataset.sources}
        results["setup"]["shards"] = sum(len(s.shards) for s in dataset.sources)

        # ---- resume cost
        resume: dict[str, dict[str, Any]] = {
            str(p): {"ours_inprocess_s": s} for p, s in ours_resume(config, dataset, repeats).items()
        }
        sup = ShadowLoaderSupervisor(
            config, job=f"bench-{uuid.uuid4().hex[:6]}", node="n0", lanes=1, max_micro_batch=MICRO_BATCH, slots=8
        ).start()
        try:
            time.sleep(0.5)
            shadow_resume(sup, dataset, POSITIONS[0], 1, prewarm=False)  # warm-up
            for position in POSITIONS:
                cold, _ = shadow_resume(sup, dataset, position, repeats, prewarm=False)
                warm, adopted = shadow_resume(sup, dataset, position, repeats, prewarm=True)
                resume[str(position)].update(
                    ours_shadow_cold_s=cold, ours_shadow_prefilled_s=warm, prefilled_adopted=f"{adopted}/{repeats}"
                )
            if have_sdl:
                results["sdl_map_state_patch_verified"] = check_map_state_patch(dataset)
                results["sdl_stream_state_verified"] = check_stream_state(config)
                for position in POSITIONS:
                    row = resume[str(position)]
                    row["sdl_stream_s"] = sdl_stream_resume(config, position, repeats)
                    row["sdl_map_s"] = sdl_map_resume(dataset, position, max(1, repeats // 2))["resume_s"]
            results["resume"] = resume

            # ---- throughput and overhead
            step_s = trainer_step_time(10 if args.quick else 30)
            results["trainer"] = {
                "step_s": step_s,
                "samples_per_s": MICRO_BATCH / step_s,
                "what": "examples/pretrain_tiny.py TinyGPT, batch 8 x seq 64, 1 thread",
            }
            results["throughput"] = {
                "inprocess": inprocess_throughput(config, 500 if args.quick else 2000),
                "shadow": shadow_throughput(sup, 500 if args.quick else 2000),
            }
            results["paced"] = shadow_paced(sup, step_s, 3.0 if args.quick else 8.0)
            results["paced"]["inprocess_s_per_batch"] = inprocess_paced(config, step_s, results["paced"]["steps"])
            results["idle"] = shadow_idle(sup, 5.0 if args.quick else 20.0)
        finally:
            sup.close()
            dataset.close()

    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


def print_table(r: dict[str, Any]) -> None:
    ms = lambda s: f"{s * 1000:9.2f} ms"  # noqa: E731
    res = r["resume"]
    lo, hi = res[str(POSITIONS[0])], res[str(POSITIONS[-1])]
    print(f"\nmachine: {r['machine']}")
    print(f"data: {r['setup']['samples_per_source']} samples of {SEQ_LEN + 1} tokens, {r['setup']['shards']} shards")
    print("\nresume: time to the first batch after a restart (median)")
    header = f"{'position':>10} | {'ours in-proc':>12} | {'shadow cold':>12} | {'shadow prefilled':>16}"
    if "sdl_stream_s" in lo:
        header += f" | {'SDL stateful stream':>20} | {'SDL map 1.2e7 (skip)':>20} | {'SDL stream / ours':>17}"
    print(header)
    print("-" * len(header))
    for position in POSITIONS:
        row = res[str(position)]
        line = (
            f"{position:>10.0e} | {ms(row['ours_inprocess_s']):>12} | {ms(row['ours_shadow_cold_s']):>12} | "
            f"{ms(row['ours_shadow_prefilled_s']):>16}"
        )
        if "sdl_stream_s" in row:
            line += (
                f" | {ms(row['sdl_stream_s']):>20} | {ms(row['sdl_map_s']):>20} | "
                f"{row['sdl_stream_s'] / row['ours_inprocess_s']:>16.2f}x"
            )
        print(line)
    flat = hi["ours_inprocess_s"] / lo["ours_inprocess_s"]
    flat_shadow = hi["ours_shadow_prefilled_s"] / lo["ours_shadow_prefilled_s"]
    print(
        f"flatness, ours in-process: cost(1e7) / cost(1e3) = {flat:.2f} (target <= 1.2); "
        f"shadow prefilled: {flat_shadow:.2f}"
    )
    if "sdl_map_s" in hi:
        print(
            "StatefulDataLoader, stateful stream: cost(1e7) / cost(1e3) = "
            f"{hi['sdl_stream_s'] / lo['sdl_stream_s']:.2f}; "
            f"map-style: {hi['sdl_map_s'] / lo['sdl_map_s']:.1f}"
        )
    t, tp, p = r["trainer"], r["throughput"], r["paced"]
    print("\nthroughput (samples of 65 tokens per second, one rank)")
    print(f"  trainer consumes     {t['samples_per_s']:10.0f}/s  ({t['step_s'] * 1000:.1f} ms/step, {t['what']})")
    for name in ("inprocess", "shadow"):
        print(
            f"  {name:<10} loader   {tp[name]['samples_per_s']:10.0f}/s  "
            f"= {tp[name]['samples_per_s'] / t['samples_per_s']:.0f}x the trainer's need"
        )
    print(
        f"  in-process loader CPU per batch, back to back: {tp['inprocess']['cpu_s_per_batch'] * 1000:.3f} ms "
        f"= {100 * tp['inprocess']['cpu_s_per_batch'] / t['step_s']:.1f}% of a step"
    )
    print(f"\nshadow loader while keeping pace with the trainer ({p['steps']} steps):")
    print(
        f"  loader process CPU {p['loader_cpu_percent_of_one_core']:.1f}% of one core, "
        f"RSS {p['loader_rss_mib']:.0f} MiB (USS {p['loader_uss_mib']:.0f} MiB), "
        f"shared memory {p['shm_segment_kib']:.0f} KiB"
    )
    print(
        f"  trainer-side cost per batch {p['client_s_per_batch'] * 1000:.3f} ms "
        f"({100 * p['client_s_per_batch'] / t['step_s']:.1f}% of a step; copy, CRC and sample-id check); "
        f"batch already waiting: {100 * p['ready_on_arrival_fraction']:.0f}%"
    )
    print(
        f"  the in-process loader at the same pace: {p['inprocess_s_per_batch'] * 1000:.3f} ms per batch "
        f"({100 * p['inprocess_s_per_batch'] / t['step_s']:.1f}% of a step)"
    )
    print(
        f"  idle (ring full, no trainer asking, {r['idle']['seconds']:.0f} s): "
        f"loader process CPU {r['idle']['loader_cpu_percent_of_one_core']:.2f}% of one core"
    )


if __name__ == "__main__":
    sys.exit(main())
