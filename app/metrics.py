"""Prometheus metrics of one application instance, exposed at ``GET /metrics``.

Each app gets its own registry (tests build several apps in one process). Route labels are
the matched path template (``/devices/{device_id}``), never the raw path, so label cardinality
stays bounded whatever clients send.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

# the *_created series double the exposition size and nobody graphs them
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream

#: seconds; from a cache hit (~1 ms) to the largest time limit (60 s)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "kperf_http_requests",
            "HTTP requests by route template, method and status code",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "kperf_http_request_duration_seconds",
            "HTTP request latency in seconds by route template, method and status code",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.solve_time = Histogram(
            "kperf_solve_duration_seconds",
            "seconds per job by kind and outcome: ok (complete answer) and partial (best so "
            "far at the time limit) count the time inside the worker; timeout (504: the solver "
            "found nothing, the worker was killed, or too little budget was left to start), "
            "crash, memory and error count the time in the pool until the failure",
            ["kind", "outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.cache = Counter(
            "kperf_cache_lookups",
            "result cache lookups by outcome (hit or miss)",
            ["result"],
            registry=self.registry,
        )
        self.singleflight = Counter(
            "kperf_singleflight",
            "cache misses by how single-flight answered them (app/singleflight.py): holder "
            "(took the store's lock and solved), coalesced (per request: an identical request of "
            "this process was being answered), waited (another replica's answer, read from the "
            "store), took_over (the holder died: took its expired lock and solved), uncacheable "
            "(the holder's answer was incomplete: solved without the lock), deadline (waited the "
            "request's time limit, then solved), no_store (store unavailable: solved without "
            "single-flight), local (in-process store: no lock)",
            ["outcome"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "kperf_store_errors",
            "shared store (KPERF_STORE_URL) operations that failed and were answered without "
            "the store, by operation (get, put, ping, ...)",
            ["operation"],
            registry=self.registry,
        )
        self.store_decode_failures = Counter(
            "kperf_store_decode_failures",
            "stored values dropped because they did not decode (foreign, corrupt, other "
            "version), by namespace kind and reason",
            ["namespace", "reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "kperf_queue_depth",
            "requests waiting for a free solver worker",
            registry=self.registry,
        )
        self.worker_restarts = Counter(
            "kperf_worker_restarts",
            "solver worker processes replaced, by reason (timeout: killed overrunning; crash: "
            "died during a job; idle: died between jobs; memory: over the address-space cap)",
            ["reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "kperf_rejected_requests",
            "requests refused before solving, by reason (queue_full, body_too_large, deadline: "
            "too little of the time limit left to start a solve)",
            ["reason"],
            registry=self.registry,
        )
        self.profiles_expired = Counter(
            "kperf_profiles_expired",
            "calibrated profiles (kind calibrated) and draft records (kind draft) deleted after "
            "KPERF_PROFILE_IDLE_EXPIRY_S without use",
            ["kind"],
            registry=self.registry,
        )
        self.certificate_mismatches = Counter(
            "kperf_certificate_mismatches",
            "certified solves whose Z3 certificate found a configuration better than the exact "
            "scorer's best (a bug in the scorer or the encoding; answered from the Z3 search)",
            registry=self.registry,
        )
