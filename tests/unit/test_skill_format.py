"""The SKILL.md format: public Agent Skills load unchanged; mistakes get messages to act on."""

from __future__ import annotations

import pytest

from skills.format import SkillFormatError, content_hash, load_folder, parse_skill

# As public skill collections write them: no `version`, `allowed-tools` as one string.
PUBLIC = """---
name: pdf-forms
description: Fill in PDF forms. Use when the user asks to complete a PDF form.
license: Complete terms in LICENSE.txt
allowed-tools: Bash(python:*) Read, Write
metadata:
  author: someone
  version: "1.2"
---

# Filling forms

Read `forms.md` first.
"""


def test_a_public_skill_loads_unchanged_and_is_versioned_by_its_metadata() -> None:
    skill = parse_skill(PUBLIC, {"forms.md": "How to fill forms."})
    assert skill.name == "pdf-forms"
    assert skill.allowed_tools == ("Bash", "Read", "Write")
    assert skill.label == "1.2" and skill.license == "Complete terms in LICENSE.txt"
    assert skill.instructions.startswith("# Filling forms")
    assert skill.content_hash == content_hash(PUBLIC, {"forms.md": "How to fill forms."})


def test_a_skill_without_a_version_is_named_by_its_content_hash() -> None:
    text = PUBLIC.replace('  version: "1.2"\n', "")
    skill = parse_skill(text)
    assert skill.label == skill.content_hash.removeprefix("sha256:")[:12]
    assert parse_skill(text, {"a.md": "x"}).content_hash != skill.content_hash


def test_both_spellings_of_allowed_tools_and_a_list_are_accepted() -> None:
    text = PUBLIC.replace("allowed-tools: Bash(python:*) Read, Write", "allowed_tools: [a, b]")
    assert parse_skill(text).allowed_tools == ("a", "b")
    no_tools = PUBLIC.replace("allowed-tools: Bash(python:*) Read, Write\n", "")
    assert parse_skill(no_tools).allowed_tools is None


@pytest.mark.parametrize(
    ("text", "resources", "message"),
    [
        ("no front matter", {}, "must start with YAML front matter"),
        (PUBLIC.replace("name: pdf-forms", "name: PDF Forms"), {}, "lowercase letters"),
        (PUBLIC.replace("description: Fill", "descr: Fill"), {}, "description must say"),
        (PUBLIC.split("---\n\n")[0] + "---\n", {}, "no instructions"),
        (PUBLIC.replace("metadata:", "metadata: [1]\nx:"), {}, "metadata must be a mapping"),
        (PUBLIC.replace("license: Complete", "license: [Complete"), {}, "not valid YAML"),
        (PUBLIC, {"../etc/passwd": "x"}, "must be relative"),
        (PUBLIC, {".env": "x"}, "must be relative"),
    ],
)
def test_mistakes_are_refused_with_what_to_fix(
    text: str, resources: dict[str, str], message: str
) -> None:
    with pytest.raises(SkillFormatError, match=message):
        parse_skill(text, resources)


def test_a_folder_must_carry_the_skill_name(tmp_path: pytest.TempPathFactory) -> None:
    folder = tmp_path / "other"  # type: ignore[operator]
    folder.mkdir()
    (folder / "SKILL.md").write_text(PUBLIC)
    (folder / "forms.md").write_text("How to fill forms.")
    (folder / "logo.png").write_bytes(b"\x89PNG\x00\xff")
    with pytest.raises(SkillFormatError, match="names must match"):
        load_folder(folder)
    renamed = folder.rename(folder.parent / "pdf-forms")
    skill = load_folder(renamed)
    assert list(skill.resources) == ["forms.md"]  # binary files are left out
