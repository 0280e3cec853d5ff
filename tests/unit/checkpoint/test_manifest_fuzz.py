"""Property tests of the commit-marker reader: whatever the bytes, a manifest or ManifestError.

Bounded: 80 to 150 examples per property, under a second each on a quiet 2-core machine.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalwart.checkpoint.errors import ManifestError
from stalwart.checkpoint.manifest import (
    DTYPE_SIZES,
    Manifest,
    SavingLayout,
    ShardEntry,
    TensorEntry,
    read_manifest,
)

FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def wrap(body: bytes) -> bytes:
    """A marker whose digest is right for whatever body it carries."""
    return b'{"xxh3_64":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'","manifest":' + body + b"}"


def valid() -> Manifest:
    shard = ShardEntry(
        offsets=[0, 0],
        lengths=[4, 3],
        file="__0_0.distcp",
        blob_offset=10,
        blob_length=200,
        data_offset=64,
        nbytes=48,
        checksum=1,
        block_checksums=[2],
        rank=0,
    )
    return Manifest(
        step=7,
        created_at=1.8e9,  # fixed: the examples must not depend on the clock
        layout=SavingLayout(world_size=2),
        tensors={"w": TensorEntry(dtype="float32", shape=[8, 3], shards=[shard])},
        mappings={"w": ["model", "w"]},
    )


def check(raw: bytes) -> Manifest | None:
    try:
        m = read_manifest(raw, "fuzz")
    except ManifestError as exc:
        assert "fuzz" in str(exc)  # it names where
        return None
    for t in m.tensors.values():  # what comes out is consistent: a load may trust its boxes
        assert t.dtype in DTYPE_SIZES
        for s in t.shards:
            assert "/" not in s.file and not s.file.startswith(".")
            assert all(o + n <= d for o, n, d in zip(s.offsets, s.lengths, t.shape, strict=True))
            assert s.blob_offset <= s.data_offset and s.data_offset + s.nbytes <= s.blob_offset + s.blob_length
    return m


def test_a_valid_marker_round_trips() -> None:
    m = valid()
    assert check(m.to_bytes()) == m


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(raw: bytes) -> None:
    check(raw)


@FUZZ
@given(st.data())
def test_damaged_markers(data: st.DataObject) -> None:
    raw = bytearray(valid().to_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "delete":
            del raw[at]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    check(bytes(raw))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_right_digest_wrong_content(data: st.DataObject) -> None:
    """Valid JSON with a valid digest, and any values in any field: still only ManifestError."""
    doc = json.loads(valid().model_dump_json())
    for _ in range(data.draw(st.integers(1, 3))):
        node = doc
        path = data.draw(st.lists(st.sampled_from(["tensors", "w", "shards", 0, "layout", "mappings"]), max_size=3))
        for key in path:
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and node:
                node = node[0]
        if isinstance(node, dict) and node:
            field = data.draw(st.sampled_from(sorted(node)))
            node[field] = data.draw(JSON)
    check(wrap(json.dumps(doc).encode()))


def test_a_pickle_as_a_marker_runs_nothing(tmp_path: Path) -> None:
    class RunsCode:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(tmp_path / "pwned"), "w"))

    for raw in (pickle.dumps(RunsCode()), wrap(pickle.dumps(RunsCode()))):
        assert check(raw) is None
    assert not (tmp_path / "pwned").exists()
