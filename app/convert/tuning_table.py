"""POST /tuning-table: request -> configurations -> per-key rankings (app/convert/tuning_model)
-> choice, loss bound and file (solver/tuning_table) -> response. Worker side (numpy)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from app.convert.fields import shared_fields
from app.convert.tuning_model import KeyRanking, TableModel
from app.schemas.base import provenance_out
from app.schemas.optimize import OptimizeTilingRequest, TilingOut, ValueRange
from app.schemas.tuning_table import (
    EngineConfigOut,
    LossOverRange,
    SelectionOut,
    ShortlistEntryOut,
    TableEntryOut,
    TableSearchOut,
    TableSearchSpace,
    TableSolverOut,
    TuningTableRequest,
    TuningTableResponse,
)
from device_profiles import DeviceProfile
from device_profiles.provenance import provenance
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import Tiling, ns_to_us
from solver import InfeasibleSearchSpace, InvalidSearchSpace, values_from_range
from solver.errors import UnknownDeviceName
from solver.tuning_table import (
    ENGINE_FIELDS,
    EngineFormat,
    engine_device_name,
    engine_file_name,
    num_stages_for,
    pieces,
    select,
    worst_loss,
)
from solver.tuning_table.loss import nearest_key_index, sample_points

#: most configurations a table may weigh (the candidate list's own limit)
MAX_TABLE_CONFIGURATIONS = 4096


@dataclass(frozen=True, slots=True)
class TableConfig:
    """One configuration asked for: the tiling the model sees and the engine's integers."""

    tiling: Tiling
    group_size_m: int
    num_warps: int
    num_stages: int
    input_index: int | None = None
    params: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TableCurve:
    """Predicted times (us) over the range, for the picture: at each sampled M, the entry the
    engine takes, the M's optimum, and the bound of its piece."""

    ms: tuple[int, ...]
    entry_us: tuple[float, ...]
    optimum_us: tuple[float, ...]
    key_of: tuple[int, ...]
    worst_loss: float


@dataclass(frozen=True, slots=True)
class TableAnswer:
    response: TuningTableResponse
    curve: TableCurve


def _values(field: str, spec: list[int] | ValueRange) -> tuple[int, ...]:
    if isinstance(spec, ValueRange):
        return values_from_range(field, spec.min, spec.max, spec.multiple_of)
    if not spec:
        raise InvalidSearchSpace(field, "the list is empty")
    return tuple(dict.fromkeys(spec))


def _compute_capability(request: TuningTableRequest, profile: DeviceProfile | None) -> str | None:
    if request.compute_capability is not None:
        return request.compute_capability
    return None if profile is None else profile.compute_capability


def _engine_int(params: dict[str, Any] | None, name: str, default: int, where: str) -> int:
    value = (params or {}).get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        # params are opaque JSON to the schema: this rule is the table's own
        raise InvalidSearchSpace(
            f"{where}.params", f"{name} must be a positive integer, got {value!r}"
        )
    return value


def configurations(request: TuningTableRequest, profile: DeviceProfile | None) -> list[TableConfig]:
    """Every configuration the request asks to choose from, in request order; fp8 tables
    keep BLOCK_SIZE_K within one quantization block (the engines' kernels read one K scale
    per tile), so a listed tile_k not dividing the block's K is a 422 naming it."""
    capability = _compute_capability(request, profile)
    block_k = request.block_shape[1]
    quantized = request.dtype == "fp8" and request.format != "json"
    if request.candidates is not None:
        if request.search_space is not None:
            raise ModelInputError("candidates", "give either search_space or candidates, not both")
        out = []
        for i, c in enumerate(request.candidates):
            where = f"candidates.{i}"
            if quantized and block_k % c.tile_k:
                raise InvalidSearchSpace(
                    f"{where}.tile_k", f"{c.tile_k} does not divide the block's K of {block_k}"
                )
            out.append(
                TableConfig(
                    Tiling(c.tile_m, c.tile_n, c.tile_k, c.buffer_depth),
                    group_size_m=_engine_int(
                        c.params, "GROUP_SIZE_M", request.group_size_m[0], where
                    ),
                    num_warps=_engine_int(c.params, "num_warps", request.num_warps[0], where),
                    num_stages=_engine_int(
                        c.params, "num_stages", num_stages_for(c.buffer_depth, capability), where
                    ),
                    input_index=i,
                    params=c.params,
                )
            )
        return out
    space = request.search_space or TableSearchSpace()
    tile_k = _values("search_space.tile_k", space.tile_k)
    if quantized:
        bad = [t for t in tile_k if block_k % t]
        if "tile_k" in space.model_fields_set and bad:
            raise InvalidSearchSpace(
                "search_space.tile_k", f"{bad} do not divide the block's K of {block_k}"
            )
        tile_k = tuple(t for t in tile_k if not block_k % t)
        if not tile_k:
            raise InvalidSearchSpace("block_shape", f"no default tile_k divides {block_k}")
    dims = (
        _values("search_space.tile_m", space.tile_m),
        _values("search_space.tile_n", space.tile_n),
        tile_k,
        _values("search_space.buffer_depth", space.buffer_depth),
    )
    if math.prod(len(d) for d in dims) > MAX_TABLE_CONFIGURATIONS:
        raise InvalidSearchSpace(
            "search_space",
            f"{math.prod(len(d) for d in dims)} tilings exceed the limit of "
            f"{MAX_TABLE_CONFIGURATIONS}",
        )
    return [
        TableConfig(
            Tiling(tm, tn, tk, depth),
            group_size_m=request.group_size_m[0],
            num_warps=request.num_warps[0],
            num_stages=num_stages_for(depth, capability),
        )
        for tm in dims[0]
        for tn in dims[1]
        for tk in dims[2]
        for depth in dims[3]
    ]


def _file_name(request: TuningTableRequest, profile: DeviceProfile | None, device: str) -> str:
    fmt = EngineFormat(request.format)
    name = engine_device_name(profile.name if profile is not None else None, request.device_name)
    if fmt is not EngineFormat.JSON:
        if request.dtype != "fp8":
            raise ModelInputError(
                "format",
                f"the engines read {fmt.value} tables for block-quantized fp8 only; ask for "
                "format 'json' for other dtypes",
            )
        if name is None:
            raise UnknownDeviceName(device)
    bn, bk = request.block_shape
    return engine_file_name(fmt, request.n, request.k, name or device, request.dtype, (bn, bk))


def optimize_template(request: TuningTableRequest, m: int) -> OptimizeTilingRequest:
    """The /optimize-tiling request each key's ranking is (``m`` replaced per key)."""
    return OptimizeTilingRequest.model_validate(
        {
            "m": m,
            "n": request.n,
            "k": request.k,
            "dtype": request.dtype,
            "device": request.device,
            "device_params": request.device_params.model_dump()
            if request.device_params is not None
            else None,
            "pipeline_model": request.pipeline_model,
            "shortlist": "exploit",
            "time_limit_s": request.time_limit_s,
        }
    )


def table_model(request: TuningTableRequest, profile: DeviceProfile | None) -> TableModel:
    """The model's view of the request's distinct tilings, its feasible ones known (ranked
    once at the first key): what benches and tests ask for times and simulations."""
    tilings = list(dict.fromkeys(c.tiling for c in configurations(request, profile)))
    model = TableModel(optimize_template(request, min(request.m_values)), profile, tilings)
    model.rank(min(request.m_values), request.time_limit_s, 1)
    return model


def _tiling_out(t: Tiling) -> TilingOut:
    return TilingOut(**shared_fields(TilingOut, t))


def _engine_config(tiling: Tiling, config: TableConfig) -> EngineConfigOut:
    block = (tiling.tile_m, tiling.tile_n, tiling.tile_k)
    engine = (config.group_size_m, config.num_warps, config.num_stages)
    return EngineConfigOut(**dict(zip(ENGINE_FIELDS, (*block, *engine), strict=True)))


def _shortlist(
    ranking: KeyRanking,
    times: list[int],
    model: TableModel,
    first_of: dict[Tiling, TableConfig],
    count: int,
) -> list[ShortlistEntryOut]:
    order = sorted(range(len(times)), key=lambda i: (i != ranking.best, times[i], i))
    return [
        ShortlistEntryOut(
            tiling=_tiling_out(model.tilings[i]),
            config=_engine_config(model.tilings[i], first_of[model.tilings[i]]),
            predicted_time_us=ns_to_us(times[i]),
            probability_best=ranking.probability_best[i],
        )
        for i in order[:count]
    ]


def build_table(
    request: TuningTableRequest, profile: DeviceProfile | None, time_limit_s: float
) -> TableAnswer:
    """The table for ``request`` on ``profile`` (None: inline device_params)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    keys = sorted(request.m_values)
    if len(set(keys)) != len(keys):
        raise ModelInputError("m_values", "the keys must be distinct (one entry per M)")
    configs = configurations(request, profile)
    first_of: dict[Tiling, TableConfig] = {}
    for config in configs:
        first_of.setdefault(config.tiling, config)
    model = TableModel(optimize_template(request, keys[0]), profile, list(first_of))
    file_name = _file_name(request, profile, model.device)
    rankings: list[KeyRanking] = []
    # every tiling's uncertainty is needed when the choice may fall beyond the shortlist
    ranked = request.shortlist_per_m if request.max_distinct_configs is None else None
    for m in keys:
        left = time_limit_s - (time.perf_counter() - started)
        try:
            rankings.append(model.rank(m, max(left, 0.05), ranked))
        except InfeasibleSearchSpace as exc:
            field = "candidates" if request.candidates is not None else "search_space"
            raise InfeasibleSearchSpace(exc.reason, exc.rejected, field=field) from None
    parts = pieces(keys, request.loss_sample_step)
    points = sample_points(parts)
    # the exact scorer's times (the ones each key's certificate checks) at the keys and the
    # pieces' ends
    times_at = model.times(sorted(set(points) | set(keys)))
    chosen = select(
        [times_at[m] for m in keys], [r.best for r in rankings], request.max_distinct_configs
    )
    bound = worst_loss(parts, chosen.chosen, times_at)
    entries = []
    for ranking, c in zip(rankings, chosen.chosen, strict=True):
        tiling = model.tilings[c]
        config = first_of[tiling]
        times = times_at[ranking.m]
        optimum_ns = times[ranking.best]
        entries.append(
            TableEntryOut(
                m=ranking.m,
                config=_engine_config(tiling, config),
                tiling=_tiling_out(tiling),
                input_index=config.input_index,
                params=config.params,
                predicted_time_us=ns_to_us(times[c]),
                interval_low_us=ranking.interval_low_us[c],
                interval_high_us=ranking.interval_high_us[c],
                probability_best=ranking.probability_best[c],
                optimum=_tiling_out(model.tilings[ranking.best]),
                optimum_time_us=ns_to_us(optimum_ns),
                loss=times[c] / optimum_ns - 1.0,
                certified=ranking.certified,
                shortlist=_shortlist(ranking, times, model, first_of, request.shortlist_per_m),
            )
        )
    file: dict[str, dict[str, Any]] = {}
    for entry in entries:
        values: dict[str, Any] = entry.config.model_dump()
        if request.format == "json":
            values |= {"predicted_time_us": entry.predicted_time_us, "loss": entry.loss}
        file[str(entry.m)] = values
    certified = sum(r.certified for r in rankings)
    response = TuningTableResponse(
        status="optimal" if certified == len(rankings) else "timeout",
        device=model.device,
        pipeline_model=model.pipeline_model,
        **request.model_dump(include={"dtype", "n", "k", "format"}),  # as asked
        file_name=file_name,
        file=file,
        entries=entries,
        loss_over_range=LossOverRange(
            m_min=keys[0],
            m_max=keys[-1],
            sample_step=request.loss_sample_step,
            pieces=len(parts),
            points_evaluated=len(points),
            worst_loss=bound.worst_loss,
            worst_m_first=bound.worst_piece.first_m,
            worst_m_last=bound.worst_piece.last_m,
            worst_key=keys[bound.worst_piece.key_index],
        ),
        selection=SelectionOut(
            max_distinct_configs=request.max_distinct_configs,
            distinct_configs=chosen.distinct,
            **shared_fields(SelectionOut, chosen),  # the losses, exact, z3_checks
        ),
        search=TableSearchOut(
            # a space asks for every num_warps and GROUP_SIZE_M listed with each tiling
            configurations=len(configs)
            if request.candidates is not None
            else len(configs) * len(request.num_warps) * len(request.group_size_m),
            tilings=len(first_of),
            feasible_tilings=len(model.tilings),
            rejected=model.rejected_counts,
        ),
        solver=TableSolverOut(
            elapsed_ms=(time.perf_counter() - started) * 1000,
            cpu_ms=(time.process_time() - cpu_started) * 1000,
            keys_certified=certified,
            z3_checks=sum(r.z3_checks for r in rankings) + chosen.z3_checks,
        ),
        profile_provenance=provenance_out(provenance(profile, "gemm-ws")),
    )
    curve = TableCurve(
        ms=tuple(points),
        entry_us=tuple(
            ns_to_us(times_at[m][chosen.chosen[nearest_key_index(keys, m)]]) for m in points
        ),
        optimum_us=tuple(ns_to_us(min(times_at[m])) for m in points),
        key_of=tuple(keys[nearest_key_index(keys, m)] for m in points),
        worst_loss=bound.worst_loss,
    )
    return TableAnswer(response, curve)
