"""Localization on the fault corpus: precision and recall of the machines each verdict names for
eviction, against the labels, on the captured cases and on cases grown from them to ~1,000 ranks.

Run with -s to see the table. A flagged machine that is not faulty is a false positive; a faulty
machine not flagged is a false negative; cases whose truth is "no machine" (user code, NaN, healthy
runs) can only add false positives.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from support.paths import REPO

from stalwart.diagnosis import diagnose
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.corpus_gen import expand_hang, expand_metrics

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
TARGET = 1.0  # F1: every machine named is faulty, and every faulty machine is named


def grown(cases: list[CorpusCase]) -> list[CorpusCase]:
    out = []
    for c in cases:
        topo = c.bundle.topology
        if c.bundle.stacks and topo is not None and c.fault.rank >= 0 and not c.fault.more_ranks and topo.dp >= 2:
            tp = 4 if topo.tp > 1 else 1
            dp = max(topo.dp, 512 // (tp * topo.pp))
            out.append(expand_hang(c, tp=tp, dp=dp, ranks_per_node=max(2, tp)))
            # and with the capture's noise at scale: 1% of dumps failed, half taken without --native
            out.append(expand_hang(c, tp=tp, dp=dp, ranks_per_node=max(2, tp), failed=0.01, plain=0.5, seed=len(out)))
        if c.bundle.metrics:
            out.append(expand_metrics(c, nodes=256, seed=len(out)))
    return out


@pytest.fixture(scope="module")
def captured() -> list[CorpusCase]:
    cases = load_corpus(CORPUS)
    assert len(cases) >= 30, "the corpus is missing cases: run tests/data/diagnosis/capture.py missing"
    return cases


def test_every_case_is_labeled_and_mostly_captured(captured: list[CorpusCase]) -> None:
    kinds = defaultdict(int)
    for c in captured:
        kinds[c.bundle.kind] += 1
        nodes = set(c.bundle.topology.rank_nodes.values() if c.bundle.topology else [])
        assert set(c.truth.faulty_nodes) <= nodes, c.name
    assert kinds["hang"] >= 10 and kinds["slowdown"] >= 4 and kinds["crash"] >= 8
    real = [c for c in captured if c.source.startswith("captured")]
    assert len(real) >= 0.75 * len(captured)


def test_localization_precision_and_recall(captured: list[CorpusCase]) -> None:
    cases = captured + grown(captured)
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # tp, fp, fn, cases
    wrong_class = []
    misses = []
    for case in cases:
        verdict = diagnose(case.bundle)
        truth, got = set(case.truth.faulty_nodes), set(verdict.flagged)
        origin = "captured" if case.source.startswith(("captured", "composed")) else "generated"
        for key in ("all", origin, case.bundle.kind):
            t = tally[key]
            t[0] += len(truth & got)
            t[1] += len(got - truth)
            t[2] += len(truth - got)
            t[3] += 1
        if truth != got:
            misses.append(f"{case.name}: truth {sorted(truth)}, flagged {sorted(got)} ({verdict.summary[:160]})")
        if verdict.failure_class != case.truth.failure_class:
            wrong_class.append(f"{case.name}: {verdict.failure_class} (truth {case.truth.failure_class})")

    def pr(t: list[int]) -> tuple[float, float]:
        return t[0] / max(1, t[0] + t[1]), t[0] / max(1, t[0] + t[2])

    print(
        f"\nlocalization on {len(cases)} cases ({len(captured)} captured or composed, {len(cases) - len(captured)} "
        "generated)"
    )
    print(f"{'':12} {'cases':>5} {'TP':>4} {'FP':>4} {'FN':>4} {'precision':>9} {'recall':>7}")
    for key in ("all", "captured", "generated", "hang", "slowdown", "crash", "metrics"):
        if key in tally:
            t = tally[key]
            p, r = pr(t)
            print(f"{key:12} {t[3]:5d} {t[0]:4d} {t[1]:4d} {t[2]:4d} {p:9.3f} {r:7.3f}")
    print(f"failure class right on {len(cases) - len(wrong_class)} of {len(cases)} cases")
    for m in misses + wrong_class:
        print("  ", m)
    precision, recall = pr(tally["all"])
    f1 = 2 * precision * recall / max(1e-9, precision + recall)
    assert f1 >= TARGET, (precision, recall, misses)
    assert len(wrong_class) <= 0.05 * len(cases), wrong_class
