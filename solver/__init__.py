"""Z3 optimizer for GeMM-WS tilings (warp-specialization-gemm-model.txt §3.2)."""

from perfmodel.gemm_ws import ELEMENT_BYTES
from perfmodel.pipelines.paper import serve_encoding
from solver.encoding import encode_listed
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

# the paper model's Z3 encoding is the solver's own: handed to the model here, where every
# solver import passes, so the model layer imports nothing of the solver
serve_encoding(encode_listed)

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
