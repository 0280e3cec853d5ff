"""The job spec names users' data (Hugging Face files, Megatron indexed datasets) and the agent hands
the loader those sources, with their paths made absolute against the job file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from stalwart.agents.data_plane import data_config
from stalwart.spec.model import DataSettings


def test_hf_and_megatron_sources_reach_the_loader(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "docs.parquet").write_bytes(b"")
    (tmp_path / "data" / "corpus.bin").write_bytes(b"")
    settings = DataSettings.model_validate(
        {
            "seqLen": 32,
            "sources": [
                {
                    "name": "docs",
                    "format": "hf",
                    "shards": ["data/*.parquet"],
                    "tokenizer": "tok/tokenizer.json",
                    "textField": "body",
                    "indexDir": "index",
                },
                {"name": "corpus", "format": "megatron", "shards": ["data/corpus.bin"], "weight": 2},
            ],
        }
    )
    docs, corpus = data_config(settings, tmp_path).sources
    assert docs.format == "hf" and docs.text_field == "body"
    assert docs.tokenizer == str(tmp_path / "tok" / "tokenizer.json") and docs.index_dir == str(tmp_path / "index")
    assert docs.shards == [str(tmp_path / "data" / "*.parquet")]
    assert corpus.format == "megatron" and corpus.tokenizer is None


def test_a_source_that_cannot_be_read_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="'docs': format hf needs a tokenizer"):
        DataSettings.model_validate({"seqLen": 8, "sources": [{"name": "docs", "format": "hf", "shards": ["a.jsonl"]}]})
    with pytest.raises(ValidationError, match="only read for format hf"):
        DataSettings.model_validate(
            {"seqLen": 8, "sources": [{"name": "c", "format": "megatron", "shards": ["c.bin"], "tokenizer": "t.json"}]}
        )
    settings = DataSettings.model_validate(
        {"seqLen": 8, "sources": [{"name": "c", "format": "megatron", "shards": ["missing/*.bin"]}]}
    )
    with pytest.raises(FileNotFoundError, match="no megatron files match"):
        data_config(settings, tmp_path)
