"""Per-M configuration tables for serving engines (vLLM, SGLang): which configuration each M
key gets, at most a given number of distinct ones, and how much the engine's nearest-key
lookup may lose between the keys.

Everything here works on predicted times in integer nanoseconds, indexed by configuration: it
knows nothing of the pipeline model that produced them (app/convert/tuning_model.py asks the
model; this package only chooses and bounds).
"""

from solver.tuning_table.engine_format import (
    ENGINE_FIELDS,
    EngineFormat,
    engine_device_name,
    engine_file_name,
    num_stages_for,
)
from solver.tuning_table.loss import LossBound, Piece, nearest_key_index, pieces, worst_loss
from solver.tuning_table.selection import Selection, select

__all__ = [
    "ENGINE_FIELDS",
    "EngineFormat",
    "LossBound",
    "Piece",
    "Selection",
    "engine_device_name",
    "engine_file_name",
    "nearest_key_index",
    "num_stages_for",
    "pieces",
    "select",
    "worst_loss",
]
