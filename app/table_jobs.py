"""Jobs of POST /tuning-table, run inside pool workers, and the async path to them.

The table's answer is not cached: it is one solve per key plus the sampling of the range,
about as long as a cache miss of a few /optimize-tiling requests.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from app.auth import Principal
from app.jobs import RENDER_KIND
from app.schemas.tuning_table import TuningTableRequest, TuningTableResponse
from app.service import EncodedAnswer, Job, Service, run_job
from device_profiles import DeviceProfile

TABLE_KIND = "tuning-table"

_TABLE_JSON = TypeAdapter(TuningTableResponse)


def _solve(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, time_limit_s: float
) -> Any:
    # numpy and the model: worker side only
    from app.convert.tuning_table import build_table

    request = TuningTableRequest.model_validate(request_json)
    profile = None if profile_json is None else DeviceProfile.model_validate(profile_json)
    return build_table(request, profile, time_limit_s)


def tuning_table_job(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, time_limit_s: float
) -> EncodedAnswer:
    """Worker side of POST /tuning-table: the table as its JSON body."""
    answer = _solve(request_json, profile_json, time_limit_s)
    return EncodedAnswer(_TABLE_JSON.dump_json(answer.response), cacheable=False)


def tuning_table_svg_job(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, time_limit_s: float
) -> bytes:
    """Worker side of the SVG answer: the table, then its time over M."""
    answer = _solve(request_json, profile_json, time_limit_s)
    import render

    curve, response = answer.curve, answer.response
    svg: bytes = render.tuning_table_svg(
        curve.ms,
        curve.entry_us,
        curve.optimum_us,
        [e.m for e in response.entries],
        curve.worst_loss,
        title=f"N={response.n}, K={response.k}, {response.dtype} on {response.device}: "
        f"{response.selection.distinct_configs} configurations",
    )
    return svg


async def _profile(
    service: Service, request: TuningTableRequest, viewer: Principal
) -> DeviceProfile | None:
    if request.device is None or request.device_params is not None:
        return None
    return await service.resolve_profile(request.device, viewer)


async def tuning_table_via_pool(
    service: Service, request: TuningTableRequest, viewer: Principal, *, svg: bool = False
) -> bytes:
    """The table's JSON body (or its picture) from a worker; ``viewer`` may read the
    device (a calibrated one is its tenant's)."""
    time_limit_s = service.resolve_time_limit(
        request.time_limit_s if "time_limit_s" in request.model_fields_set else None
    )
    profile = await _profile(service, request, viewer)
    kwargs = {
        "request_json": request.model_dump(mode="json"),
        "profile_json": None if profile is None else profile.model_dump(mode="json"),
    }
    if svg:
        picture: bytes = await run_job(
            service, Job(RENDER_KIND, tuning_table_svg_job, kwargs, time_limit_s)
        )
        return picture
    answer: EncodedAnswer = await run_job(
        service, Job(TABLE_KIND, tuning_table_job, kwargs, time_limit_s)
    )
    return answer.body
