"""The skill format: a folder with a `SKILL.md` (YAML front matter, then instructions).

It is the Agent Skills format that public skill collections use: the front matter has `name`
and `description`, and optionally `license`, `allowed-tools` (a space- or comma-separated
string, or a list; `allowed_tools` is accepted too), `metadata`, and agentrt's own `version`,
`model` and `tags`. The body is the instructions. Every other text file of the folder is a
resource the skill can read. A skill without a `version` is named by its content hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

SKILL_FILE = "SKILL.md"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
MAX_DESCRIPTION = 1_024
MAX_INSTRUCTIONS = 200_000
MAX_RESOURCE_BYTES = 256_000
MAX_RESOURCES = 200
# A resource path: relative, forward slashes, no `..`, no hidden parts.
_RESOURCE = re.compile(r"^(?!/)(?!.*(?:^|/)\.)[A-Za-z0-9_./ -]{1,300}$")


class SkillFormatError(ValueError):
    """A skill that does not follow the format; the message says what to fix."""


@dataclass(frozen=True)
class Skill:
    """One version of a skill, as parsed.

    Attributes:
        name: What `load_skill` is called with.
        description: When to use it; the only text the model sees before loading it.
        instructions: The body of `SKILL.md`.
        content_hash: `sha256:` of `SKILL.md` and every resource; names the exact version.
        label: The front matter's `version`, or the short content hash when it has none.
        allowed_tools: Tool names the skill may use (None: it does not narrow the tools).
        model: The model the skill was written for (informative).
        tags: Free labels for listings.
        license: The skill's licence, as its front matter says.
        metadata: The front matter's `metadata` mapping.
        front_matter: The whole front matter, as written.
        skill_md: The text of `SKILL.md`.
        resources: Other files of the folder, by relative path.
    """

    name: str
    description: str
    instructions: str
    content_hash: str
    label: str
    allowed_tools: tuple[str, ...] | None = None
    model: str | None = None
    tags: tuple[str, ...] = ()
    license: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    front_matter: Mapping[str, Any] = field(default_factory=dict)
    skill_md: str = ""
    resources: Mapping[str, str] = field(default_factory=dict)


def content_hash(skill_md: str, resources: Mapping[str, str]) -> str:
    """Return the hash that names one exact version of a skill's files."""
    canonical = json.dumps(
        {"SKILL.md": skill_md, "resources": dict(sorted(resources.items()))},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def tool_names(value: Any) -> tuple[str, ...] | None:
    """Read `allowed-tools`: a list, or a string of names separated by spaces or commas.

    Entries such as `Bash(git:*)` name the tool before the parenthesis.
    """
    if value is None:
        return None
    if isinstance(value, str):
        parts = re.findall(r"[^\s,()]+(?:\([^)]*\))?", value)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        parts = list(value)
    else:
        raise SkillFormatError("allowed-tools must be a list of tool names or one string of them")
    return tuple(dict.fromkeys(p.split("(", 1)[0].strip() for p in parts if p.strip()))


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise SkillFormatError(f"{what} must be a list of strings")


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Split `SKILL.md` into its front matter and its body."""
    match = _FRONT.match(text.lstrip("\ufeff"))
    if match is None:
        raise SkillFormatError(
            "SKILL.md must start with YAML front matter between two '---' lines, "
            "with at least 'name' and 'description'"
        )
    try:
        # Every scalar stays text: `version: 1.10` is "1.10", and a skill named `off` or
        # `yes` keeps its name (YAML 1.1 would read them as numbers and booleans).
        front = yaml.load(match.group(1), Loader=yaml.BaseLoader) or {}
    except yaml.YAMLError as exc:
        raise SkillFormatError(f"the front matter of SKILL.md is not valid YAML: {exc}") from exc
    if not isinstance(front, dict):
        raise SkillFormatError("the front matter of SKILL.md must be a mapping of keys to values")
    return front, text.lstrip("\ufeff")[match.end() :].strip()


def check_resources(resources: Mapping[str, str]) -> dict[str, str]:
    """Refuse resource paths that could escape the skill, and oversized or too many files."""
    if len(resources) > MAX_RESOURCES:
        raise SkillFormatError(f"a skill may hold at most {MAX_RESOURCES} resource files")
    out: dict[str, str] = {}
    for path, text in resources.items():
        parts = PurePosixPath(path).parts
        if not _RESOURCE.match(path) or ".." in parts or path == SKILL_FILE:
            raise SkillFormatError(
                f"resource path {path!r} must be relative, use '/' and plain names "
                "(letters, digits, '._- '), and not be SKILL.md"
            )
        if not isinstance(text, str):
            raise SkillFormatError(f"resource {path!r} must be text")
        if len(text.encode()) > MAX_RESOURCE_BYTES:
            raise SkillFormatError(f"resource {path!r} is over {MAX_RESOURCE_BYTES} bytes")
        out[path] = text
    return out


def parse_skill(skill_md: str, resources: Mapping[str, str] | None = None) -> Skill:
    """Parse a skill from the text of its `SKILL.md` and its resources.

    Raises:
        SkillFormatError: the text does not follow the format (the message says what to fix).
    """
    front, body = split_front_matter(skill_md)
    name = front.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SkillFormatError(
            f"name {name!r} must be 1-64 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError(f"skill {name!r}: description must say what it does and when")
    if len(description) > MAX_DESCRIPTION:
        raise SkillFormatError(f"skill {name!r}: description is over {MAX_DESCRIPTION} characters")
    if not body:
        raise SkillFormatError(
            f"skill {name!r}: SKILL.md has no instructions after the front matter"
        )
    if len(body) > MAX_INSTRUCTIONS:
        raise SkillFormatError(
            f"skill {name!r}: instructions are over {MAX_INSTRUCTIONS} characters"
        )
    files = check_resources(resources or {})
    metadata = front.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SkillFormatError(f"skill {name!r}: metadata must be a mapping")
    raw_tools = front.get("allowed-tools", front.get("allowed_tools"))
    digest = content_hash(skill_md, files)
    version = front.get("version", metadata.get("version"))
    model = front.get("model")
    return Skill(
        name=name,
        description=description.strip(),
        instructions=body,
        content_hash=digest,
        label=str(version) if version is not None else digest[len("sha256:") :][:12],
        allowed_tools=tool_names(raw_tools),
        model=str(model) if model is not None else None,
        tags=_strings(front.get("tags"), "tags"),
        license=str(front["license"]) if front.get("license") is not None else None,
        metadata=metadata,
        front_matter=front,
        skill_md=skill_md,
        resources=files,
    )


def read_folder(folder: Path) -> tuple[str, dict[str, str]]:
    """Read a skill folder: the text of `SKILL.md` and its text resources.

    Files that are not UTF-8 text (images, archives) are left out: the model reads text.
    """
    skill_md = (folder / SKILL_FILE).read_text(encoding="utf-8")
    resources: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if not path.is_file() or relative == SKILL_FILE:
            continue
        if any(part.startswith(".") or part == "__pycache__" for part in Path(relative).parts):
            continue
        try:
            resources[relative] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return skill_md, resources


def load_folder(folder: Path) -> Skill:
    """Parse the skill in `folder`.

    Raises:
        SkillFormatError: the folder has no valid `SKILL.md`, or its name differs from the
            folder's.
    """
    if not (folder / SKILL_FILE).is_file():
        raise SkillFormatError(f"{folder} has no {SKILL_FILE}")
    skill = parse_skill(*read_folder(folder))
    if skill.name != folder.name:
        raise SkillFormatError(
            f"skill {skill.name!r} lives in folder {folder.name!r}: the names must match"
        )
    return skill


def scan(root: Path) -> tuple[list[Skill], dict[str, str]]:
    """Parse every skill folder under `root`; return the skills and, by folder, the errors."""
    skills: list[Skill] = []
    errors: dict[str, str] = {}
    if not root.is_dir():
        return skills, errors
    for folder in sorted(p for p in root.iterdir() if (p / SKILL_FILE).is_file()):
        try:
            skills.append(load_folder(folder))
        except (SkillFormatError, OSError, UnicodeDecodeError) as exc:
            errors[folder.name] = str(exc)
    return skills, errors


REPOSITORY_SKILLS = Path(__file__).resolve().parent
