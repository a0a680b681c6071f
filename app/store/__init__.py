"""What replicas share: result-cache entries, calibrated profiles, stored measurements.

One interface (:class:`Store`), several backends chosen by ``KPERF_STORE_URL``. Values are
opaque bytes to the store; callers encode them (JSON, never pickles).
"""

from app.store.base import MemoryStore, Store, StoreHealth, StoreUnavailable
from app.store.checked import CheckedStore, CorruptValue, seal, unseal
from app.store.registry import BACKENDS, make_backend, make_store
from app.store.resilient import ResilientStore
from app.store.transaction import CapExceeded, Counter, Delete, Expect, Outcome, Put, Unmet

__all__ = [
    "BACKENDS",
    "CapExceeded",
    "Counter",
    "Delete",
    "Expect",
    "Outcome",
    "Put",
    "CheckedStore",
    "CorruptValue",
    "MemoryStore",
    "ResilientStore",
    "Store",
    "StoreHealth",
    "StoreUnavailable",
    "Unmet",
    "make_backend",
    "make_store",
    "seal",
    "unseal",
]
