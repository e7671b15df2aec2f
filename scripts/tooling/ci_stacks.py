"""Stack bookkeeping for the GitHub workflows: which stacks a change touches, which are
marked for deployment on merge, and the policy-pack config of a stack.

    python scripts/tooling/ci_stacks.py changed BASE HEAD    # JSON list for a job matrix
    python scripts/tooling/ci_stacks.py deploy BASE HEAD     # ... those in auto-deploy.txt
    python scripts/tooling/ci_stacks.py matrix STACK...      # the same for named stacks
    python scripts/tooling/ci_stacks.py policy-config STACK  # JSON for --policy-pack-config
    python scripts/tooling/ci_stacks.py guardrails STACK...  # the policy pack offline; 1 fails

Why Python, what each needs, the matrix entry: docs/design/cli.md#ci_stacks
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
STACKS_DIR = ROOT / "stacks"
AUTO_DEPLOY_FILE = STACKS_DIR / "auto-deploy.txt"
DEFAULT_REGION = "us-west-2"
_STACK_FILE = re.compile(r"^stacks/Pulumi\.(?P<stack>[A-Za-z0-9_.-]+)\.ya?ml$")


def stack_of(path: str) -> str | None:
    """`stacks/Pulumi.<stack>.yaml` -> `<stack>`; None for any other path."""
    match = _STACK_FILE.match(path)
    return match.group("stack") if match else None


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""Git's empty tree: the base of a push that created the branch (`before` is all zeros)."""


def changed_files(base: str, head: str, root: Path = ROOT) -> list[str]:
    """Files added, copied, modified or renamed between the merge base of `base` and `head`."""
    revisions = f"{EMPTY_TREE}..{head}" if re.fullmatch(r"0+", base) else f"{base}...{head}"
    result = subprocess.run(
        ["git", "diff", "--name-only", "--diff-filter=ACMR", revisions],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return [line for line in result.stdout.splitlines() if line]


def changed_stacks(paths: Iterable[str], stacks_dir: Path = STACKS_DIR) -> list[str]:
    """Stacks whose file is among `paths` and still exists, sorted and unique."""
    stacks = {stack_of(p) for p in paths} - {None}
    return sorted(s for s in stacks if s is not None and stack_file(s, stacks_dir).exists())


def stack_file(stack: str, stacks_dir: Path = STACKS_DIR) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def marked_for_deploy(path: Path = AUTO_DEPLOY_FILE) -> list[str]:
    """Stack names listed in stacks/auto-deploy.txt (one per line, `#` starts a comment)."""
    if not path.exists():
        return []
    names = []
    for line in path.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"{path.name}: {name!r} is not a stack name")
            names.append(name)
    return names


def region_of(stack: str, stacks_dir: Path = STACKS_DIR) -> str:
    """The stack's `aws:region` (the AWS credentials step needs it before Pulumi runs)."""
    document = yaml.safe_load(stack_file(stack, stacks_dir).read_text()) or {}
    region = (document.get("config") or {}).get("aws:region", DEFAULT_REGION)
    return str(region)


def matrix(stacks: Iterable[str], stacks_dir: Path = STACKS_DIR) -> list[dict[str, str]]:
    return [
        {
            "stack": s,
            "file": str(stack_file(s, stacks_dir).relative_to(stacks_dir.parent)),
            "region": region_of(s, stacks_dir),
        }
        for s in stacks
    ]


def _path(stack: str) -> Path:
    path = Path(stack)
    return path if path.suffix in (".yaml", ".yml") else stack_file(stack)


def run_guardrails(stacks: list[str]) -> int:
    """Evaluate each stack offline and print the guardrails' verdict; 1 if any is violated."""
    # Imported here: the program and its config model need the repository's environment.
    from infra.config import StackConfigError
    from infra.policy.offline import check_stack_file

    status = 0
    for stack in stacks:
        try:
            violations = check_stack_file(_path(stack))
        except StackConfigError as error:
            print(f"{stack}: rejected by the config model\n{error}")
            status = 1
            continue
        if violations:
            status = 1
            print(f"{stack}: {len(violations)} guardrail violation(s)")
            print("\n".join(f"  {v}" for v in violations))
        else:
            print(f"{stack}: every guardrail passed")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("changed", "deploy"):
        sub = commands.add_parser(name)
        sub.add_argument("base", help="base commit (the PR's base, or the push's `before`)")
        sub.add_argument("head", help="head commit")
    named = commands.add_parser("matrix")
    named.add_argument("stacks", nargs="+", help="stack names")
    policy = commands.add_parser("policy-config")
    policy.add_argument("stack", help="stack name or stack file")
    rails = commands.add_parser("guardrails")
    rails.add_argument("stacks", nargs="+", help="stack names or stack files")
    options = parser.parse_args(argv)

    if options.command == "guardrails":
        return run_guardrails(options.stacks)

    if options.command == "policy-config":
        # Imported here: it needs pydantic and the infra package, the stack lists do not.
        from infra.policy.settings import policy_config_from_stack_file

        print(json.dumps(policy_config_from_stack_file(_path(options.stack)), indent=2))
        return 0
    if options.command == "matrix":
        missing = [s for s in options.stacks if not stack_file(s).exists()]
        if missing:
            parser.error(f"no stack file for {', '.join(missing)} under {STACKS_DIR}")
        print(json.dumps(matrix(options.stacks)))
        return 0
    stacks = changed_stacks(changed_files(options.base, options.head))
    if options.command == "deploy":
        marked = set(marked_for_deploy())
        stacks = [s for s in stacks if s in marked]
    print(json.dumps(matrix(stacks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
