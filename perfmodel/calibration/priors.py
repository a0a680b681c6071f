"""Log-normal priors of calibratable figures: :class:`perfmodel.belief.Prior`, here for the
calibration package's readers (docs/model-notes.md, "Priors")."""

from perfmodel.belief import Prior

__all__ = ["Prior"]
