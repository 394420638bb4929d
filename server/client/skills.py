"""`agentrt skills list|show|push|versions|enable|disable|usage`: skills over the API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

from server.client.errors import ClientError
from server.client.follow import ClientConfig, check, open_client


def print_skills(skills: list[dict[str, Any]]) -> None:
    """Print skills as a table with a header."""
    print(f"{'SKILL':<28} {'VERSION':>7}  {'LABEL':<12} {'OWNER':<10} {'ON':<3} DESCRIPTION")
    for s in skills:
        on = "yes" if s.get("enabled", True) else "no"
        pin = f"@{s['pinnedVersion']}" if s.get("pinnedVersion") else ""
        description = (
            s["description"] if len(s["description"]) <= 60 else s["description"][:57] + "..."
        )
        print(
            f"{s['name'] + pin:<28} {s['version']:>7}  {s['label'][:12]:<12} {s['owner']:<10} "
            f"{on:<3} {description}"
        )


def read_skill_folder(path: str) -> dict[str, Any]:
    """Read a skill folder into the body of `POST /api/skills`.

    Raises:
        ClientError: the folder has no SKILL.md or cannot be read.
    """
    # Imported here: `agentrt --help` must not load YAML.
    from skills.format import SKILL_FILE, read_folder

    folder = Path(path)
    if not (folder / SKILL_FILE).is_file():
        raise ClientError(f"{folder} has no {SKILL_FILE}: push a skill folder")
    try:
        skill_md, resources = read_folder(folder)
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientError(f"cannot read {folder}: {exc}") from None
    return {"skillMd": skill_md, "resources": resources}


async def _act(client: httpx.AsyncClient, args: argparse.Namespace) -> None:
    if args.action == "list":
        found = check(await client.get("/api/skills"))
        print_skills(found["skills"])
        for broken in found["errors"]:
            print(f"(not loaded) {broken['name']}: {broken['error']}")
    elif args.action == "show":
        name, _, version = args.skill.partition("@")
        params = {"version": version} if version else {}
        print(json.dumps(check(await client.get(f"/api/skills/{name}", params=params)), indent=2))
    elif args.action == "push":
        response = await client.post("/api/skills", json=read_skill_folder(args.folder))
        made = check(response)
        new = response.headers.get("Skill-Version-Created") != "false"
        what = f"version {made['version']}" if new else "unchanged (no new version)"
        print(f"skill {made['name']}: {what} ({made['hash']})")
    elif args.action == "versions":
        print_skills(check(await client.get(f"/api/skills/{args.name}/versions"))["versions"])
    elif args.action in ("enable", "disable"):
        body = {"version": args.version} if args.action == "enable" and args.version else None
        made = check(await client.post(f"/api/skills/{args.name}/{args.action}", json=body))
        pin = f", pinned to version {made['pinnedVersion']}" if made.get("pinnedVersion") else ""
        print(f"skill {made['name']}: {'enabled' if made['enabled'] else 'disabled'}{pin}")
    elif args.action == "usage":
        print(json.dumps(check(await client.get(f"/api/skills/{args.name}/usage")), indent=2))


async def cmd_skills(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt skills ...`."""
    async with open_client(settings.url, settings.api_key) as client:
        try:
            await _act(client, args)
        except httpx.ConnectError:
            raise ClientError(
                f"no server at {settings.url}; start one with 'make run', or point at yours "
                "with --url or AGENTRT_URL"
            ) from None
    return 0


def add_skills_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    """Add `agentrt skills ...` to the command line."""
    skills = sub.add_parser("skills", help="skills: list, show, push, versions, enable, disable")
    actions = skills.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[client], help="the skills you see, at current versions")
    show = actions.add_parser("show", parents=[client], help="one skill as JSON, instructions too")
    show.add_argument("skill", help="NAME or NAME@VERSION")
    push = actions.add_parser(
        "push", parents=[client], help="upload a skill folder (SKILL.md + files) as a new version"
    )
    push.add_argument("folder", help="the skill's folder")
    for name, text in (
        ("versions", "every version of a skill, newest first"),
        ("enable", "let runs load a skill (optionally pinned to a version)"),
        ("disable", "refuse new loads of a skill"),
        ("usage", "how many runs loaded each version"),
    ):
        action = actions.add_parser(name, parents=[client], help=text)
        action.add_argument("name", help="the skill's name")
        if name == "enable":
            action.add_argument("--version", type=int, help="pin this version (default: latest)")
