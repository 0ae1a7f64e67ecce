"""What every result file says about how it was made."""

from __future__ import annotations


def test_a_result_is_dirty_only_when_the_code_differs_from_its_commit(tmp_path, monkeypatch):
    """A study rewrites its report as it goes: results written after that must still name a clean commit, while
    any change to the code marks them dirty."""
    import subprocess

    from orthorank.harness import results

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "src" / "orthorank").mkdir(parents=True)
    (tmp_path / "studies").mkdir()
    code, report = tmp_path / "src" / "orthorank" / "results.py", tmp_path / "studies" / "report.html"
    code.write_text("x = 1\n")
    report.write_text("before\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(results, "__file__", str(code))
    assert not results.git_commit().endswith("-dirty")
    report.write_text("after\n")
    assert not results.git_commit().endswith("-dirty")
    code.write_text("x = 2\n")
    assert results.git_commit().endswith("-dirty")
