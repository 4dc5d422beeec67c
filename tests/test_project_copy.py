from pathlib import Path


def test_project_copy_is_a_git_and_dvc_repo(project_copy: Path):
    assert (project_copy / ".git").is_dir()
    assert (project_copy / ".dvc" / "config").is_file()
    assert (project_copy / "params.yaml").is_file()
    assert not (project_copy / ".venv").exists()
