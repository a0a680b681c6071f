"""Request and response models of POST /optimize-tiling/batch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.base import RequestModel
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse

#: schema-level ceiling; the configured limit (KPERF_MAX_BATCH_ITEMS) is usually lower
MAX_BATCH_ITEMS_CEILING = 1024


class OptimizeTilingBatchRequest(RequestModel):
    problems: list[OptimizeTilingRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH_ITEMS_CEILING,
        description="problems to solve; at most the server's max_batch_items (GET /readyz "
        "does not report it: see the README's Configuration table)",
    )


class FieldReason(BaseModel):
    field: str
    reason: str


class ItemProblem(BaseModel):
    """The problem+json body this item would have had as a single request."""

    type: str
    title: str
    status: int = Field(description="HTTP status the item would have had on its own")
    detail: str
    errors: list[FieldReason]


class BatchItem(BaseModel):
    index: int = Field(description="position of the problem in the request")
    status: Literal["ok", "error"]
    cache: Literal["hit", "miss"] | None = Field(
        default=None, description="whether the answer came from the result cache"
    )
    result: OptimizeTilingResponse | None = None
    error: ItemProblem | None = None


class OptimizeTilingBatchResponse(BaseModel):
    items: list[BatchItem] = Field(description="one entry per problem, in request order")
