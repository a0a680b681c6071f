"""What replicas share: result-cache entries, calibrated profiles, stored measurements.

One interface (:class:`Store`), several backends chosen by ``KPERF_STORE_URL``. Values are
opaque bytes to the store; callers encode them (JSON, never pickles).
"""

from app.store.base import MemoryStore, Store, StoreUnavailable

__all__ = ["MemoryStore", "Store", "StoreUnavailable"]
