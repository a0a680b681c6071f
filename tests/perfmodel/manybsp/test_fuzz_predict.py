"""Mutated real PTX through the whole predictor: a finite prediction, or a typed input error.

The front end's own fuzz test (tests/perfmodel/ptx/test_fuzz.py) stops at parsing; mutated
modules that still parse (a duplicated or swapped line, a changed operand) go on through the
classification, the BLOCK table, the supersteps and eq. (4)-(25) here. Anything but a
``ModelInputError`` (mapped to a 4xx) would be a 500 in the service.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, event, given, settings

from device_profiles import get_profile
from perfmodel.errors import ModelInputError
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.ptx import parse_module
from tests.perfmodel.ptx.test_fuzz import mutated

GTX_760 = device_from_profile(get_profile("gtx-760"))


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(mutated())
def test_mutated_ptx_predicts_or_fails_typed(text: str) -> None:
    try:
        # the fixtures hold several entries: predict the first one the module still has
        kernel = next(iter(parse_module(text).entries), None)
        result = predict_kernel(
            PredictRequest(
                ptx=text,
                device=GTX_760,
                grid=(64, 1, 1),
                block=(256, 1, 1),
                kernel=kernel,
                registers_per_thread=32,
            )
        )
    except ModelInputError as exc:
        assert exc.field and exc.reason
        event("typed input error")
        return
    event("predicted")
    cycles = result.estimate.kernel_exec_cycle
    assert math.isfinite(cycles) and cycles > 0
