"""README and docs quote committed results through generated blocks (tools.docs_blocks)."""

from __future__ import annotations

from pathlib import Path

from tools.docs_blocks import main, sync

ROOT = Path(__file__).resolve().parents[2]


def test_every_generated_block_equals_its_committed_file():
    stale = sync(ROOT, check=True)
    assert not stale, f"run `python -m tools.docs_blocks`: {stale}"


def test_blocks_are_rewritten_from_their_files_and_a_missing_file_is_an_error(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("intro\n<!-- generated: results.md -->\nold numbers\n<!-- end generated -->\noutro\n")
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert "stale: docs/page.md: results.md" in capsys.readouterr().out
    assert main(["--root", str(tmp_path)]) == 0
    assert page.read_text() == ("intro\n<!-- generated: results.md -->\n| a | b |\n|---|---|\n| 1 | 2 |\n"
                                "<!-- end generated -->\noutro\n")
    assert main(["--root", str(tmp_path), "--check"]) == 0
    page.write_text("<!-- generated: gone.md -->\nx\n<!-- end generated -->\n")
    assert main(["--root", str(tmp_path)]) == 2
    assert "gone.md, which does not exist" in capsys.readouterr().err
