"""Who is calling: bearer tokens, each naming a tenant and a role, so one service
can serve many teams' pipelines apart.

The tokens file (``KPERF_TOKENS_FILE``, a mounted secret) holds one token a line, hashed:
``<sha256 hex of the token> <tenant> <role>``; ``#`` starts a comment. The service never
sees a token at rest, only its digest: a leaked file opens nothing. A presented token is
hashed and compared against every line with ``hmac.compare_digest`` and no early exit, so the
time taken does not tell how much of a digest matched, nor which line did.

Roles rank ``read`` < ``write`` < ``admin``: ``read`` may only ask (and only needs a token when
``KPERF_AUTH_READS`` is set), ``write`` may also calibrate and post, recalibrate, rename and
delete its own tenant's devices, ``admin`` may do so to any tenant's. Without a tokens file
authentication is off and every caller is the one tenant :data:`LOCAL` with the admin role:
right for a loopback port, wrong anywhere else (the README says so, and the server logs it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.field_errors import FieldReasonError

Role = Literal["read", "write", "admin"]
ROLES: tuple[Role, ...] = ("read", "write", "admin")
#: tenant names: they appear in store keys and answers
TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    role: Role

    def may(self, role: Role) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


#: every caller while authentication is off
LOCAL = Principal("local", "admin")
#: the tenant of a caller without a token, where reads need none
ANONYMOUS = "anonymous"
#: tenant names no tokens file may give: the two above (a tenant of that name would own what
#: every untokened or unauthenticated caller reads and writes)
RESERVED_TENANTS = frozenset({LOCAL.tenant, ANONYMOUS})


class Unauthorized(Exception):
    """No token, or one no line of the tokens file knows (401)."""


class Forbidden(FieldReasonError):
    """A known caller whose role or tenant does not allow this (403 naming ``field``)."""


def hash_token(token: str) -> str:
    """What the tokens file holds for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenTable:
    entries: tuple[tuple[bytes, Principal], ...]
    #: whether reads need a token too
    reads_required: bool = False

    @classmethod
    def load(
        cls, path: Path, *, reads_required: bool = False, reserved: Iterable[str] = ()
    ) -> TokenTable:
        """The table of ``path``; ValueError naming the line of any malformed one, or of one
        whose tenant is :data:`RESERVED_TENANTS` or in ``reserved`` (the shipped profile
        ids: a draft record is ``<tenant>@<shipped id>``, and a tenant named like a device
        reads as one in every answer and log)."""
        refused = RESERVED_TENANTS | set(reserved)
        entries: list[tuple[bytes, Principal]] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 3:
                raise ValueError(f"{path}:{number}: expected '<sha256 hex> <tenant> <role>'")
            digest, tenant, role = fields
            if not _DIGEST.match(digest):
                raise ValueError(f"{path}:{number}: the token must be its sha256, 64 hex digits")
            if not TENANT.match(tenant):
                raise ValueError(f"{path}:{number}: tenant must match {TENANT.pattern}")
            if tenant in refused:
                raise ValueError(
                    f"{path}:{number}: tenant {tenant!r} is reserved ("
                    + (
                        "a shipped device id"
                        if tenant not in RESERVED_TENANTS
                        else "the tenant of callers without a token, or of every caller without a "
                        "tokens file"
                    )
                    + "); choose another name"
                )
            if role not in ROLES:
                raise ValueError(f"{path}:{number}: role must be one of {', '.join(ROLES)}")
            entries.append((bytes.fromhex(digest), Principal(tenant, role)))
        if not entries:
            raise ValueError(f"{path}: no tokens; unset KPERF_TOKENS_FILE to turn auth off")
        return cls(tuple(entries), reads_required)

    def lookup(self, token: str) -> Principal | None:
        presented = hashlib.sha256(token.encode("utf-8")).digest()
        found: Principal | None = None
        for digest, principal in self.entries:  # every line, whichever matches
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def caller(table: TokenTable | None, authorization: str | None, needed: Role) -> Principal:
    """Who sends ``authorization``, allowed ``needed``; Unauthorized or Forbidden otherwise."""
    if table is None:
        return LOCAL
    token = bearer(authorization)
    if token is None:
        if needed == "read" and not table.reads_required:
            return Principal(ANONYMOUS, "read")
        raise Unauthorized(
            "send Authorization: Bearer <token> (see the README, 'Run it for a team')"
        )
    principal = table.lookup(token)
    if principal is None:
        raise Unauthorized("the token is not known to this server")
    if not principal.may(needed):
        raise Forbidden(
            "authorization", f"tenant {principal.tenant}'s {principal.role} token may not {needed}"
        )
    return principal


def check_owner(principal: Principal, owner: str | None, device_id: str) -> None:
    """Forbidden unless ``principal`` owns ``device_id`` (``owner``) or is an admin."""
    if principal.role == "admin" or owner == principal.tenant:
        return
    # no owner: a shipped profile, or one calibrated before tenants existed (admins only)
    whose = "nobody's (shipped, or made before tenants)" if owner is None else f"tenant {owner}'s"
    raise Forbidden(
        "device", f"{device_id} is {whose}; tenant {principal.tenant} may not change it"
    )
