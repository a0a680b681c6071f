"""Suite-wide settings."""

from __future__ import annotations

import solver.problem

# A certificate that refutes the scorer's incumbent is a bug in the scorer or the encoding:
# in tests it raises CertificateMismatch instead of being answered from Z3's model. Workers
# forked by the app's pool inherit the flag.
solver.problem.STRICT_CERTIFICATE = True
