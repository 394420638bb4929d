"""Artifacts' pure parts: byte ranges, names, media types, file paths, settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.tools import ToolException
from pydantic import ValidationError

from server.artifacts.service import byte_range
from server.artifacts.storage import content_disposition
from server.errors import RangeNotSatisfiableError
from server.settings import Settings
from tools.artifacts.api import check_name, guess_media_type
from tools.artifacts.tools import _inside

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-0", (0, 0)),
        ("bytes=2-4", (2, 4)),
        ("bytes=7-", (7, 9)),
        ("bytes=-3", (7, 9)),
        ("bytes=-30", (0, 9)),
        ("bytes=5-500", (5, 9)),
        ("bytes=4-2", None),  # invalid: ignored, the whole content is sent
        ("bytes=0-1,4-5", None),  # several ranges are not served
        ("lines=1-2", None),
        ("bytes=-", None),
    ],
)
def test_byte_ranges_of_a_ten_byte_content(
    header: str | None, expected: tuple[int, int] | None
) -> None:
    assert byte_range(header, 10) == expected


@pytest.mark.parametrize(("header", "size"), [("bytes=10-", 10), ("bytes=0-", 0), ("bytes=-1", 0)])
def test_a_range_past_the_end_is_not_satisfiable(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiableError) as caught:
        byte_range(header, size)
    assert caught.value.fields == {"size": str(size)}


def test_names_are_checked() -> None:
    assert check_name("q3 report.md") == "q3 report.md"
    for bad in ("", " padded", "a\nb", "x" * 256):
        with pytest.raises(ValueError, match="artifact name"):
            check_name(bad)


def test_media_types_are_guessed_from_the_name() -> None:
    assert guess_media_type("sales.csv") == "text/csv"
    assert guess_media_type("chart.png") == "image/png"
    assert guess_media_type("notes", "some text") == "text/plain"
    assert guess_media_type("blob", b"\x00") == "application/octet-stream"


def test_content_disposition_survives_any_file_name() -> None:
    header = content_disposition('Bericht "Q3" \u2013 Köln.md')
    assert header.startswith("attachment; filename=\"Bericht 'Q3' ? K?ln.md\"")
    assert "filename*=UTF-8''Bericht%20%22Q3%22%20%E2%80%93%20K%C3%B6ln.md" in header


def test_from_file_stays_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.txt").write_text("a")
    (tmp_path / "secret.txt").write_text("s")
    assert _inside(tmp_path / "out", "a.txt") == (tmp_path / "out" / "a.txt").resolve()
    for path, reason in (
        ("../secret.txt", "outside the workspace"),
        (str(tmp_path / "secret.txt"), "relative to the workspace"),
        ("missing.txt", "not a file"),
    ):
        with pytest.raises(ToolException, match=reason):
            _inside(tmp_path / "out", path)


def test_s3_storage_needs_a_bucket() -> None:
    with pytest.raises(ValidationError, match="AGENTRT_ARTIFACT_S3_BUCKET"):
        Settings(_env_file=None, artifact_storage="s3")  # type: ignore[call-arg]
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, artifact_retention_days=30, artifact_retention_by_tenant={"keep": None}
    )
    assert settings.artifact_retention_for("any") == 30
    assert settings.artifact_retention_for("keep") is None
