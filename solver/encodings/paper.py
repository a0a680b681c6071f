"""Z3 encoding of the paper's pipeline model, eq. (1)-(3) (perfmodel/pipelines/paper.py): the
solver's own encoding over listed tilings (solver/encoding.py ``encode_listed``), each tile
triple with the buffer depths listed with it, under the model's wave-time variant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from solver.encoding import Encoding, encode_listed

if TYPE_CHECKING:
    from perfmodel.gemm_ws_scoring import Configurations
    from perfmodel.pipeline import GemmOnMachine
    from perfmodel.pipelines.paper import PaperPipeline


def encode_paper(model: PaperPipeline, gemm: GemmOnMachine, configs: Configurations) -> Encoding:
    """Eq. (1)-(3) over exactly ``configs``."""
    tilings = configs.tilings()
    return encode_listed(gemm.shape, gemm.machine, tilings, gemm.element_bytes, model.wave_model)
