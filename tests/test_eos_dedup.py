"""Deduplication by (producer id, epoch, sequence), against a reference model (eos_models)."""

from __future__ import annotations

from eos_models import DedupModel
from hypothesis import settings

DedupModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAnyInterleavingOfSendsAndRetriesAppliesEachBatchOnceAndRetriesGetOriginalOffsets = (
    DedupModel.TestCase
)
