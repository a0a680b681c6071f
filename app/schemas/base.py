"""The base every request schema derives from: unknown fields and lax coercion are refused.

A JSON boolean or string where a number belongs (``"m": true``, ``"m": "1024"``) is a client
bug: pydantic's default (lax) mode would solve ``true`` as 1 and parse ``"1024"``; strict mode
answers 422 naming the field instead. Strict mode still accepts an integer where a float
belongs, refuses a float (even ``1024.0``) where an integer belongs, and applies to nested
models that derive from this base too. A field that must stay lax says so with
``Annotated[..., Strict(False)]`` and a comment why (e.g. integer keys of a JSON object, which
JSON can only write as strings).

Response models keep pydantic's defaults: they are built by this service, not sent to it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from device_profiles.provenance import Provenance


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields refused (``extra="forbid"``), strict types."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ProfileProvenanceOut(BaseModel):
    """Where the figures behind an answer come from."""

    kind: Literal["published", "estimated", "calibrated", "inline"] = Field(
        description="'published': every figure the model uses is cited; 'estimated': some "
        "are uncalibrated estimates (derived, with priors: GET /devices/{id}); 'calibrated': "
        "fitted to measured runs; 'inline': figures given in the request"
    )
    measurement_count: int | None = Field(
        default=None, description="runs the calibration used (calibrated profiles only)"
    )
    estimated_figures: list[str] = Field(
        default_factory=list, description="dotted names of the model's estimated figures"
    )


def provenance_out(origin: Provenance) -> ProfileProvenanceOut:
    """The response form of :func:`device_profiles.provenance.provenance`."""
    return ProfileProvenanceOut(
        kind=origin.kind,
        measurement_count=origin.measurement_count,
        estimated_figures=list(origin.estimated_figures),
    )


#: the JSON schema of a request naming its device by ``device`` (a profile id) or by
#: ``device_params`` (inline figures): exactly one of them, non-null. The model checks it too;
#: saying it in the schema keeps clients (and schemathesis) from sending neither or both.
ONE_DEVICE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "required": ["device"],
            "properties": {"device": {"type": "string"}, "device_params": {"type": "null"}},
        },
        {
            "required": ["device_params"],
            "properties": {"device_params": {"type": "object"}, "device": {"type": "null"}},
        },
    ]
}
