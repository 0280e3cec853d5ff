"""Stack aggregation: parsing real py-spy and faulthandler dumps, classifying ranks, grouping them, and
localizing a hang; plus one small live capture of a real hung gloo job."""

from __future__ import annotations

import faulthandler
import sys
import tempfile
import threading

import pytest
from support.paths import REPO

from stalwart.diagnosis import RankStack, diagnose
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.hang import analyze_stacks
from stalwart.diagnosis.parallel_groups import build_layout
from stalwart.diagnosis.stack_groups import aggregate
from stalwart.diagnosis.stack_parse import StackParser, parse_stack
from stalwart.diagnosis.stack_state import Phase, State, classify

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
sys.path.insert(0, str(REPO / "tests" / "data" / "diagnosis"))


@pytest.fixture(scope="module")
def corpus() -> dict[str, CorpusCase]:
    return {c.name: c for c in load_corpus(CORPUS)}


def texts_of(case: CorpusCase) -> dict[int, str]:
    return {s.rank: case.bundle.stack_text(s) for s in case.bundle.stacks}


def test_py_spy_native_dumps_are_normalized(corpus: dict[str, CorpusCase]) -> None:
    text = texts_of(corpus["hang-t2p4d2-sleep-r5"])[9]  # a rank of the stuck replica, in recv_forward
    assert "0x7f" in text and "(libc.so.6)" in text and "emulate_3d.py:" in text  # a real native dump
    parsed = parse_stack(text)
    assert parsed.fmt == "py-spy" and parsed.threads == 1
    assert parsed.frames[:4] == (
        "recv (distributed_c10d.py)",
        "_exception_logger.<locals>.wrapper (c10d_logger.py)",
        "_communicate (emulate_3d.py)",
        "recv_forward (emulate_3d.py)",
    )
    assert parsed.frames[-1] == "<module> (emulate_3d.py)"  # innermost first
    assert not any(":" in f.split(" (")[1] for f in parsed.frames)  # no line numbers
    assert any(f.startswith("gloo::transport::tcp::UnboundBuffer::waitRecv") for f in parsed.native)
    assert not any("<" in f or "0x" in f for f in parsed.native)  # templates and addresses stripped


def test_ranks_at_the_same_place_share_a_signature_however_captured(corpus: dict[str, CorpusCase]) -> None:
    texts = texts_of(corpus["hang-t2p4d2-sleep-r5"])
    plain = "\n".join(
        line for line in texts[9].splitlines() if not line.startswith("    ") or ".py:" in line
    )  # the same dump without native frames
    agg = aggregate([(9, texts[9]), (8, texts[8]), (99, plain)])
    assert agg.signature[9] == agg.signature[8] == agg.signature[99]
    assert texts[9] != texts[8]  # they differ in pids and addresses, not in place


def test_faulthandler_dumps_keep_the_main_thread() -> None:
    release = threading.Event()

    def data_loader_thread() -> None:
        release.wait(10)

    t = threading.Thread(target=data_loader_thread)
    t.start()
    try:
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            text = f.read()
    finally:
        release.set()
        t.join()
    parsed = parse_stack(text)
    assert parsed.fmt == "faulthandler" and parsed.threads >= 2
    assert any("test_faulthandler_dumps_keep_the_main_thread" in f for f in parsed.frames)
    assert not any("data_loader_thread" in f for f in parsed.frames)


def test_rank_states_from_real_stacks(corpus: dict[str, CorpusCase]) -> None:
    texts = texts_of(corpus["hang-t2p4d2-sleep-r5"])
    hung = classify(parse_stack(texts[5]))
    assert hung.state is State.ACTIVE and "injected_hang" in hung.where and hung.phase is Phase.FORWARD
    recv = classify(parse_stack(texts[9]))
    assert (recv.state, recv.direction, recv.phase, recv.scope) == (State.P2P_RECV, "forward", Phase.FORWARD, "pp")
    tp_wait = classify(parse_stack(texts[4]))
    assert (tp_wait.state, tp_wait.scope) == (State.COLLECTIVE, "tp")
    healthy = classify(parse_stack(texts[2]))
    assert (healthy.state, healthy.scope, healthy.phase) == (State.COLLECTIVE, "dp", Phase.SYNC)


def test_the_issue_example_one_pipeline_stuck_in_send_recv(corpus: dict[str, CorpusCase]) -> None:
    """TP=2 PP=4 DP=2: replica 0's pipeline is stuck in send/recv while the other replica reached the
    gradient all-reduce: the outliers are that pipeline's ranks, and the wait ends at the hung rank."""
    case = corpus["hang-t2p4d2-sleep-r5"]
    layout = build_layout(case.bundle.topology)  # type: ignore[arg-type]
    f = analyze_stacks(list(texts_of(case).items()), layout, StackParser())
    largest = f.aggregation.groups[0]  # replica 1, every stage, in the gradient all-reduce
    assert largest.ranks == [2, 3, 6, 7, 10, 11, 14, 15] and not largest.outlier and largest.state == "collective"
    assert f.group is not None and (f.group.kind, f.group.index) == ("mp", 0)
    assert sorted(f.group.ranks) == [0, 1, 4, 5, 8, 9, 12, 13]
    assert list(f.culprits.ranks) == [5]
    v = diagnose(case.bundle)
    assert v.failure_class == "hang" and v.flagged == ["node-2"] and v.suspects[0].node == "node-2"
    assert v.group is not None and v.group.kind == "mp" and v.action == "evict"
    assert {s.node for s in v.suspects[1:]} == {"node-0", "node-4", "node-6"}  # the rest of the pipeline, lower


def test_a_lost_message_is_blamed_on_the_rank_waiting_for_it(corpus: dict[str, CorpusCase]) -> None:
    v = diagnose(corpus["hang-t2p4d2-recv-r10"].bundle)
    assert v.flagged == ["node-5"] and "moved on" in " ".join(v.suspects[0].reasons)


def test_ranks_without_a_stack_are_suspects(corpus: dict[str, CorpusCase]) -> None:
    case = corpus["hang-t2p4d2-sleep-r5"]
    stacks = [s for s in case.bundle.stacks if s.rank != 5]  # the hung rank's dump failed
    stacks.append(RankStack(rank=5, node="node-2", text="", method="none"))
    v = diagnose(case.bundle.model_copy(update={"stacks": stacks}))
    assert v.flagged == ["node-2"] and "no stack" in v.suspects[0].reasons[0]


def test_unusable_dumps_flag_nothing(corpus: dict[str, CorpusCase]) -> None:
    """What faulthandler printed for ranks caught during interpreter shutdown (seen while building the
    corpus): no Python frame. With most dumps like that, the verdict asks for a new capture."""
    useless = "Current thread 0x00007f0e3fe70b80 (most recent call first):\n  Garbage-collecting\n  <no Python frame>\n"
    case = corpus["hang-t2p4d2-sleep-r5"]
    stacks = [
        s.model_copy(update={"text": useless if s.rank % 4 else s.text, "method": "faulthandler"})
        for s in case.bundle.stacks
    ]
    v = diagnose(case.bundle.model_copy(update={"stacks": stacks}))
    assert v.flagged == [] and v.suspects == [] and "capture again" in v.summary and v.action == "stop_time_checks"
