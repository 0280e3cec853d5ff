"""The signature database's schema: validated on load, so a bad regex or a class without a sample
fails at startup, not in the middle of an incident."""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stalwart.health.records import Severity


class BlameScope(str, Enum):
    NODE = "node"  # the machine is at fault: evict it
    JOB = "job"  # restart the job and run the stop-time checks; often a symptom of another rank
    USER_CODE = "user_code"  # the training code or its configuration: fail or roll back, do not evict


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    line: str = Field(min_length=1)
    source: str = Field(min_length=1)


class FailureClassSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    scope: BlameScope
    severity: Severity
    priority: int = Field(ge=0, le=1000)
    description: str = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)
    exit_codes: list[int] = []
    exit_codes_need_evidence: bool = False
    samples: list[Sample] = Field(min_length=1)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"pattern {p!r} is not a valid regular expression: {exc}") from None
        return patterns

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """All patterns as one alternation: one search per line per class."""
        return re.compile("|".join(f"(?:{p})" for p in self.patterns))

    def matches(self, line: str) -> bool:
        return self.regex.search(line) is not None


class SignatureDatabase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    classes: list[FailureClassSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> SignatureDatabase:
        names = [c.name for c in self.classes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"failure classes defined twice: {dupes}")
        return self

    def by_priority(self) -> list[FailureClassSpec]:
        return sorted(self.classes, key=lambda c: -c.priority)

    def get(self, name: str) -> FailureClassSpec:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)
