"""Z3 optimizer for GeMM-WS tilings (warp-specialization-gemm-model.txt §3.2)."""

from perfmodel.gemm_ws import ELEMENT_BYTES
from solver.errors import InfeasibleSearchSpace, InvalidSearchSpace, SolverTimeout
from solver.optimize import optimize_tiling
from solver.problem import (
    MAX_Z3_SEARCH_TILE_TRIPLES,
    CertificateCheck,
    SolverMode,
    SolverStatistics,
    TilingProblem,
    TilingResult,
)
from solver.search_space import SearchSpace, SearchSummary, values_from_range

__all__ = [
    "ELEMENT_BYTES",
    "MAX_Z3_SEARCH_TILE_TRIPLES",
    "CertificateCheck",
    "SolverMode",
    "InfeasibleSearchSpace",
    "InvalidSearchSpace",
    "SearchSpace",
    "SearchSummary",
    "SolverStatistics",
    "SolverTimeout",
    "TilingProblem",
    "TilingResult",
    "optimize_tiling",
    "values_from_range",
]
