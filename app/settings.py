"""Service settings: one object, read from ``KPERF_*`` environment variables.

The settings object is built once (``Settings()``) at the edge (CLI, ASGI factory) and passed
down explicitly; nothing below ``app/`` reads the environment. Every field carries its unit in
its name. The README's "Configuration" section lists these fields with their defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.store.registry import scheme_of

#: the largest max_time_limit_s a server may be configured with; request schemas accept up to
#: this, and the configured maximum is enforced per request (app/service.py)
TIME_LIMIT_CEILING_S = 3600.0

#: the largest max_calibration_measurements; request schemas accept lists up to this
MAX_CALIBRATION_MEASUREMENTS_CEILING = 1_000_000
#: below this a worker cannot even import Z3 (Python + libz3 map ~300 MB of address space)
MIN_WORKER_MEMORY_LIMIT_BYTES = 256 * 1024 * 1024


class Settings(BaseSettings):
    """Configuration of the kperf service (environment prefix ``KPERF_``)."""

    model_config = SettingsConfigDict(env_prefix="KPERF_", frozen=True, extra="ignore")

    host: str = Field(
        default="127.0.0.1", min_length=1, description="address `kperf serve` listens on"
    )
    port: int = Field(default=8000, ge=1, le=65535, description="port `kperf serve` listens on")
    workers: int = Field(default=2, ge=1, le=64, description="solver worker processes in the pool")
    queue_size: int = Field(
        default=16,
        ge=0,
        le=10_000,
        description="requests allowed to wait for a busy pool; beyond this the answer is 503",
    )
    retry_after_s: int = Field(
        default=1, ge=1, le=3600, description="Retry-After sent with a 503 when the queue is full"
    )
    default_time_limit_s: float = Field(
        default=10.0, gt=0, description="solve time limit when a request does not give one"
    )
    max_time_limit_s: float = Field(
        default=120.0,
        gt=0,
        le=TIME_LIMIT_CEILING_S,
        description="largest time_limit_s a request may ask for",
    )
    worker_memory_limit_bytes: int = Field(
        default=2 * 1024**3,
        ge=0,
        description="address-space cap (RLIMIT_AS) of each worker process; 0 disables the cap",
    )
    worker_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="niceness added to worker processes so the HTTP event loop stays responsive",
    )
    worker_startup_timeout_s: float = Field(
        default=60.0, gt=0, description="how long a new worker may take to import the solver"
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="largest request body accepted (else 413)",
    )
    readyz_worker_pids: bool = Field(
        default=False,
        description="list each solver worker's process id in /readyz (for operators on a "
        "trusted network; off by default: process ids help an attacker aim)",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="a connection must deliver a request's complete headers within this many "
        "seconds of opening (or of the request's first byte, on a reused connection), else 408 "
        "and closed (slowloris)",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="a request's complete body must arrive within this many seconds of its "
        "headers, else 408 and closed (a slow or stalled upload)",
    )
    max_ptx_bytes: int = Field(
        default=2_000_000,
        ge=1024,
        description="largest PTX text (UTF-8 bytes) accepted by /predict-kernel (else 413)",
    )
    max_search_space_candidates: int = Field(
        default=1 << 22,
        ge=1,
        description="largest search space (product of the candidate counts per dimension)",
    )
    inline_max_configurations: int = Field(
        default=1024,
        ge=0,
        le=65_536,
        description="a certified solve of at most this many configurations (no timeline) runs "
        "in a thread of the service's own process instead of a worker, one at a time; 0 sends "
        "every solve to the pool (app/inline.py)",
    )
    max_batch_items: int = Field(
        default=32, ge=1, le=1024, description="most problems in one /optimize-tiling/batch"
    )
    max_calibration_measurements: int = Field(
        default=5000,
        ge=1,
        le=MAX_CALIBRATION_MEASUREMENTS_CEILING,
        description="most measured runs one calibration fits, and one device's record holds",
    )
    cache_memory_items: int = Field(
        default=1024, ge=0, description="entries kept in the in-process LRU cache (0 disables it)"
    )
    cache_memory_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="bytes of answers kept in the in-process LRU cache (0 disables it)",
    )
    cache_max_entry_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="largest answer held in the in-process LRU (capped at cache_memory_bytes); "
        "larger ones are kept only in the shared store",
    )
    cache_path: Path | None = Field(
        default=None,
        description="SQLite file of the persistent result cache; unset disables persistence "
        "(used when store_url is unset)",
    )
    store_url: str | None = Field(
        default=None,
        description="shared store: memory://, sqlite:///path or redis://host:port/db; "
        "default sqlite at cache_path when that is set, else memory://",
    )
    cache_store_ttl_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="result-cache entries expire from the shared store after this long (0: "
        "never); only expiring keys may be evicted by Redis's volatile-lru policy",
    )
    store_timeout_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="socket timeout of a network store (Redis) per operation",
    )
    singleflight_lock_ttl_s: float = Field(
        default=5.0,
        ge=0.5,
        le=60,
        description="single-flight lock in the shared store: renewed every third of this while "
        "its holder solves; a dead holder's lock expires after it and a waiter takes over",
    )
    predict_summary_above_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="/predict-kernel answers larger than this leave their lists out unless "
        "the request asks for detail=full",
    )
    tokens_file: Path | None = Field(
        default=None,
        description="bearer tokens, hashed: one '<sha256 hex> <tenant> <role>' a line (roles "
        "read, write, admin); unset turns authentication off (every caller is tenant 'local', "
        "admin): only for a loopback port",
    )
    auth_reads: bool = Field(
        default=False,
        description="with tokens_file: reads (predict, optimize, devices) need a "
        "token too, and a tenant sees its own calibrated profiles and runs only (admins all); "
        "/healthz, /readyz and /metrics never need one",
    )
    profile_idle_expiry_s: float = Field(
        default=0.0,
        ge=0,
        description="calibrated profiles and draft records unused for this many seconds are "
        "deleted with their runs and names (0: never)",
    )
    max_profiles_per_tenant: int = Field(
        default=1000, ge=1, description="most calibrated profiles one tenant may keep stored"
    )
    max_bytes_per_tenant: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="most bytes of profiles and measured runs one tenant may keep stored",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="threshold of the kperf and uvicorn loggers"
    )
    log_json: bool = Field(default=True, description="one JSON object per log line")

    @field_validator("cache_path", "tokens_file", mode="before")
    @classmethod
    def _empty_path_is_none(cls, value: object) -> object:
        # KPERF_CACHE_PATH= (empty) in a compose file means "no persistent cache"
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("store_url", mode="before")
    @classmethod
    def _known_store(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str):
            scheme_of(value)  # ValueError listing the valid schemes
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("worker_memory_limit_bytes")
    @classmethod
    def _memory_limit_is_usable(cls, value: int) -> int:
        if 0 < value < MIN_WORKER_MEMORY_LIMIT_BYTES:
            raise ValueError(
                f"must be 0 (no cap) or at least {MIN_WORKER_MEMORY_LIMIT_BYTES} bytes: a worker "
                "needs that much address space to load Z3"
            )
        return value

    @model_validator(mode="after")
    def _default_within_max(self) -> Self:
        if self.default_time_limit_s > self.max_time_limit_s:
            raise ValueError(
                f"default_time_limit_s ({self.default_time_limit_s}) must not exceed "
                f"max_time_limit_s ({self.max_time_limit_s}); lower KPERF_DEFAULT_TIME_LIMIT_S "
                "or raise KPERF_MAX_TIME_LIMIT_S"
            )
        if self.max_ptx_bytes > self.max_body_bytes:
            raise ValueError(
                f"max_ptx_bytes ({self.max_ptx_bytes}) must not exceed max_body_bytes "
                f"({self.max_body_bytes}): the PTX travels inside the body"
            )
        return self

    @property
    def effective_store_url(self) -> str:
        """``store_url``, else SQLite at ``cache_path`` when set, else the in-process store."""
        if self.store_url is not None:
            return self.store_url
        if self.cache_path is not None:
            return f"sqlite://{self.cache_path.absolute()}"
        return "memory://"

    def hard_deadline_s(self, time_limit_s: float) -> float:
        """Wall-clock budget of one solve: the issue's bound, limit + 20 % + 100 ms."""
        return time_limit_s * 1.2 + 0.1
