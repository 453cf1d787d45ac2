"""The documents in docs/ and the README: every rule has its place in the migration guide, and
every link between them leads to a file of the repository."""

import re
from pathlib import Path

from accrewrite.registry import all_rules

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_migration_guide_covers_every_rule():
    guide = (ROOT / "docs" / "migration-guide.md").read_text()
    missing = [code for code in all_rules() if code not in guide]
    assert not missing


def test_links_lead_to_files_of_the_repository():
    broken = []
    for document in DOCUMENTS:
        prose = re.sub(r"```.*?```|`[^`]*`", "", document.read_text(), flags=re.DOTALL)  # not code
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if not re.match(r"[a-z]+://", target) and not (document.parent / target).exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert not broken
