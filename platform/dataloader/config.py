"""What data a job trains on: sources, mixture weights, the curriculum schedule, sequence length, seed.

A pydantic model because it crosses process boundaries: the job spec, the shadow loader process and
the trainer all read the same document. Positions are counted in samples (sequences), globally.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stalwart.dataloader.errors import DataError
from stalwart.dataloader.sample_id import MAX_SOURCES

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Format = Literal["stok", "hf", "megatron"]
HF_KINDS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}


class SourceSpec(_Model):
    """A named source: data files (glob patterns allowed), read as one concatenated token stream.

    `format` says what the files are: `stok` (the project's token shards, the default), `hf` (parquet,
    jsonl or arrow files read with `datasets` and tokenized with the `tokenizer` JSON file, field
    `text_field`) or `megatron` (MMapIndexedDataset `.bin` files, each with its `.idx` beside it).
    """

    name: str
    shards: Annotated[list[str], Field(min_length=1)]
    format: Format = "stok"
    tokenizer: str | None = Field(default=None, description="hf: path of a tokenizers tokenizer.json")
    text_field: str = Field(default="text", min_length=1, description="hf: the column holding the text")
    eos_token: str | None = Field(default=None, description="hf: token appended after each document")
    index_dir: str | None = Field(
        default=None, description="hf, megatron: where the one-time index goes (default: beside the data)"
    )

    @model_validator(mode="after")
    def _check_name(self) -> SourceSpec:
        if not _NAME.match(self.name):
            raise ValueError(f"source name {self.name!r}: use 1-64 letters, digits, '_', '.' or '-'")
        where = f"source {self.name!r}"
        if self.format == "hf":
            if not self.tokenizer:
                raise ValueError(f"{where}: tokenizer is required for format 'hf' (a tokenizer.json path)")
            for pattern in self.shards:
                if not any(pattern.endswith(suffix) for suffix in HF_KINDS):
                    raise ValueError(
                        f"{where}: shards entry {pattern!r} must end in one of {sorted(HF_KINDS)} for format 'hf'"
                    )
        else:
            for field in ("tokenizer", "eos_token"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{where}: {field} only applies to format 'hf' (format is {self.format!r})")
        if self.format == "megatron":
            for pattern in self.shards:
                if not pattern.endswith(".bin"):
                    raise ValueError(f"{where}: shards entry {pattern!r} must name .bin files for format 'megatron'")
        return self

    def resolve(self) -> list[Path]:
        """The shard files, in order: each pattern's matches sorted; a pattern that matches nothing is an error."""
        paths: list[Path] = []
        for pattern in self.shards:
            if glob.has_magic(pattern):
                matches = sorted(glob.glob(pattern))
                if not matches:
                    raise DataError(f"source {self.name!r}: shard pattern {pattern!r} matches no file")
                paths += map(Path, matches)
            else:
                paths.append(Path(pattern))
        return paths


class Milestone(_Model):
    """From sample `at_sample` on, mix the sources with these weights (sources left out get 0)."""

    at_sample: Annotated[int, Field(ge=0)]
    weights: dict[str, Annotated[float, Field(ge=0)]]

    @classmethod
    def at_step(cls, step: int, global_batch: int, weights: dict[str, float]) -> Milestone:
        """A milestone given in optimizer steps: step s starts at sample s * global_batch."""
        return cls(at_sample=step * global_batch, weights=weights)


class DataConfig(_Model):
    sources: Annotated[list[SourceSpec], Field(min_length=1, max_length=MAX_SOURCES)]
    weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="weights from sample 0; empty means equal weights"
    )
    schedule: list[Milestone] = Field(default_factory=list, description="curriculum: later weight changes")
    seq_len: Annotated[int, Field(ge=1, le=1 << 20)]
    seed: Annotated[int, Field(ge=0, lt=1 << 63)] = 0

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique: {names}")
        starts = [m.at_sample for m in self.schedule]
        if starts != sorted(set(starts)) or (starts and starts[0] == 0 and self.weights):
            raise ValueError(
                "schedule milestones must have strictly increasing at_sample (and use `weights` for sample 0)"
            )
        for where, weights in [("weights", self.weights)] + [
            (f"schedule milestone at sample {m.at_sample}", m.weights) for m in self.schedule
        ]:
            unknown = set(weights) - set(names)
            if unknown:
                raise ValueError(f"{where}: unknown sources {sorted(unknown)} (sources are {names})")
            is_default = where == "weights" and not weights  # no initial weights: equal weights
            if not is_default and not any(w > 0 for w in weights.values()):
                raise ValueError(f"{where}: at least one weight must be positive")
        return self

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]

    def segments(self) -> list[tuple[int, list[float]]]:
        """(first sample, weight per source in source order) for each constant-weight stretch."""
        initial = self.weights or dict.fromkeys(self.source_names, 1.0)
        out = [] if self.schedule and self.schedule[0].at_sample == 0 else [(0, initial)]
        out += [(m.at_sample, m.weights) for m in self.schedule]
        return [(start, [float(w.get(name, 0.0)) for name in self.source_names]) for start, w in out]

    def dumps(self) -> str:
        return self.model_dump_json()

    @classmethod
    def loads(cls, raw: str | bytes) -> DataConfig:
        return cls.model_validate_json(raw)
