"""The tokens file and the caller it names (app/auth.py): digests at rest, every line compared,
roles ranked; the oracle for a digest is hashlib itself, for the roles the README's table."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.auth import (
    LOCAL,
    Forbidden,
    Principal,
    TokenTable,
    Unauthorized,
    bearer,
    caller,
    check_owner,
    hash_token,
)
from app.main import create_app
from app.settings import Settings
from device_profiles import default_profiles


def _table(tmp_path: Path, text: str, **kwargs: bool) -> TokenTable:
    path = tmp_path / "tokens"
    path.write_text(text)
    return TokenTable.load(path, **kwargs)


def test_lines_hold_digests_and_name_tenant_and_role(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"s3cret").hexdigest()
    assert hash_token("s3cret") == digest
    table = _table(tmp_path, f"# comment\n\n{digest} team-a write  # trailing\n")
    assert table.lookup("s3cret") == Principal("team-a", "write")
    assert table.lookup("s3cret ") is None and table.lookup(digest) is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("s3cret team-a write", "sha256"),
        (f"{'0' * 64} Team A write", "tenant"),
        (f"{'0' * 64} team-a owner", "role"),
        (f"{'0' * 64} team-a", "expected"),
        ("# nothing", "no tokens"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_line(tmp_path: Path, line: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _table(tmp_path, line + "\n")


def test_roles_rank_and_reads_need_a_token_only_when_required(tmp_path: Path) -> None:
    lines = "".join(f"{hash_token(r)} t-{r} {r}\n" for r in ("read", "write", "admin"))
    table = _table(tmp_path, lines)
    assert caller(None, None, "write") == LOCAL  # authentication off
    assert caller(table, None, "read").role == "read"
    with pytest.raises(Unauthorized):
        caller(table, None, "write")
    with pytest.raises(Unauthorized):
        caller(table, "Bearer nope", "read")
    with pytest.raises(Forbidden):
        caller(table, "Bearer read", "write")
    assert caller(table, "bearer write", "write") == Principal("t-write", "write")
    with pytest.raises(Unauthorized):
        caller(_table(tmp_path, lines, reads_required=True), None, "read")
    assert bearer("Basic abc") is None and bearer("Bearer   ") is None


def test_only_the_owner_or_an_admin_changes_a_device() -> None:
    check_owner(Principal("a", "write"), "a", "dev")
    check_owner(Principal("b", "admin"), "a", "dev")
    with pytest.raises(Forbidden, match="tenant a's"):
        check_owner(Principal("b", "write"), "a", "dev")
    with pytest.raises(Forbidden, match="nobody.s"):
        check_owner(Principal("b", "write"), None, "v100")


@pytest.mark.parametrize("tenant", ["anonymous", "local", "h100", "rtx-a6000"])
def test_reserved_tenant_names_are_refused_naming_the_line(tmp_path: Path, tenant: str) -> None:
    """``anonymous`` is every untokened reader, ``local`` every caller without a tokens file,
    and a shipped id is a device: a tenant of any of those names is refused at load."""
    path = tmp_path / "tokens"
    path.write_text(f"{'0' * 64} team-a write\n{'1' * 64} {tenant} write\n")
    with pytest.raises(ValueError, match=rf"tokens:2: tenant '{tenant}' is reserved"):
        TokenTable.load(path, reserved=default_profiles())
    # the same file with the line renamed loads
    path.write_text(f"{'0' * 64} team-a write\n{'1' * 64} {tenant}-team write\n")
    assert len(TokenTable.load(path, reserved=default_profiles()).entries) == 2


def test_a_server_refuses_a_tokens_file_with_a_reserved_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{'0' * 64} anonymous read\n")
    with pytest.raises(ValueError, match="reserved"):
        create_app(Settings(tokens_file=path))
