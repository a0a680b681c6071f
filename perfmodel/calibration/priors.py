"""Log-normal priors of calibratable figures: :class:`perfmodel.prior.Prior`, here for the
calibration package's readers (docs/model-notes.md, "Priors")."""

from perfmodel.prior import Prior

__all__ = ["Prior"]
