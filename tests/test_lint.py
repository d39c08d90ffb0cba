"""No dead imports or unused names anywhere in the project (pyflakes)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pyflakes_is_clean():
    res = subprocess.run([sys.executable, "-m", "pyflakes", "src", "plugins", "tests", "tools"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_repository_stands_alone():
    """Nothing reads the folder beside the repository, and every `docs/...md section N` that code
    cites exists in this repository with that section."""
    import re
    shared = "sha" + "red"  # spelled apart so this file does not match its own pattern
    outside = re.compile("|".join([r"\.\./" + shared, r"parents\[\d\]\s*/\s*[\"']" + shared, "VKDFLASH_" + shared.upper()]))
    cite = re.compile(r"docs/([\w-]+\.md) sections? (\d+)")
    offenders, missing = [], []
    for path in [p for d in ("src", "plugins", "tests", "tools", "shaders") for p in (ROOT / d).rglob("*")
                 if p.suffix in (".py", ".glsl", ".comp")]:
        text = path.read_text(encoding="utf-8")
        if outside.search(text):
            offenders.append(str(path.relative_to(ROOT)))
        for doc, section in cite.findall(text):
            target = ROOT / "docs" / doc
            if not target.exists() or f"\n## {section}." not in target.read_text(encoding="utf-8"):
                missing.append(f"{path.relative_to(ROOT)}: docs/{doc} section {section}")
    assert not offenders, offenders
    assert not missing, missing
