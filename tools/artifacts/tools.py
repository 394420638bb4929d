"""The `write_artifact` tool: the model saves a file (a report, a table, code) as an artifact."""

from __future__ import annotations

from pathlib import Path

from langchain_core.tools import ToolException

from tools.artifacts.api import ArtifactRef, ArtifactSink, run_sink, save_artifact
from tools.spec import CallContext, ToolSpec, agent_tool


def _inside(root: Path, relative: str) -> Path:
    """Return `relative` resolved under `root`, or refuse a path that leaves it."""
    if Path(relative).is_absolute():
        raise ToolException(f"from_file must be a path relative to the workspace, not {relative}")
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ToolException(f"from_file {relative!r} is outside the workspace")
    if not path.is_file():
        raise ToolException(f"from_file {relative!r} is not a file in the workspace")
    return path


def _source(sink: ArtifactSink, content: str | None, from_file: str | None) -> str | Path:
    if (content is None) == (from_file is None):
        raise ToolException("give exactly one of content (the text) or from_file (a path)")
    if content is not None:
        return content
    assert from_file is not None
    if sink.file_root is None:
        raise ToolException("this agent has no workspace folder: pass the text as content")
    return _inside(sink.file_root, from_file)


# Idempotent by construction: a version is keyed by the call's idempotency key.
@agent_tool(idempotent=True)
async def write_artifact(
    name: str,
    call: CallContext,
    content: str | None = None,
    from_file: str | None = None,
    media_type: str | None = None,
) -> ArtifactRef:
    """Save a file for the user (a report, a table, code, data) as a downloadable artifact.

    Use it for any result longer than a few paragraphs or meant to be opened as a file,
    instead of pasting it into your answer. Writing a name again saves a new version. The
    result holds the artifact's link: in your answer, mention the file by name and link to it
    rather than repeating its content.

    Args:
        name: The file name, with an extension, e.g. `q3-report.md` or `sales.csv`.
        content: The file's text. Give this or from_file.
        from_file: A path in the workspace folder to save instead of text.
        media_type: The content type, e.g. `text/csv`; guessed from the name when omitted.
    """
    sink = run_sink()
    source = _source(sink, content, from_file)
    try:
        return await save_artifact(call, name, source, media_type=media_type, sink=sink)
    except ValueError as exc:
        raise ToolException(str(exc)) from exc


def artifact_tools() -> list[ToolSpec]:
    """Return the artifact tools."""
    return [write_artifact]
