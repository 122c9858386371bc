"""The workspace is found from any subdirectory, as git finds .git: the nearest folder upwards with .lab/."""

from pathlib import Path

from labctl.cli.app import Invocation
from labctl.core.workspace import find_workspace


def test_the_nearest_folder_with_a_lab_folder_is_the_workspace(tmp_path):
    (tmp_path / ".lab").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_workspace(deep) == tmp_path.resolve()
    assert find_workspace(tmp_path) == tmp_path.resolve()
    (tmp_path / "a" / ".lab").mkdir()  # a workspace inside a workspace: the nearer one wins
    assert find_workspace(deep) == (tmp_path / "a").resolve()


def test_without_one_the_folder_itself_is_a_fresh_workspace(tmp_path):
    fresh = tmp_path / "project"
    fresh.mkdir()
    (fresh / ".lab").write_text("a file, not labctl's folder")
    assert find_workspace(fresh) == fresh.resolve()


def test_a_session_walks_up_from_where_the_user_stands(tmp_path, monkeypatch):
    (tmp_path / ".lab").mkdir()
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    session = Invocation(environ={})
    assert (session.cwd, session.workspace) == (sub.resolve(), tmp_path.resolve())
    assert Invocation(workspace=sub, environ={}).workspace == sub.resolve()  # given outright: taken as is
    assert Invocation(cwd=Path(sub), environ={}).lab("demo").directory == tmp_path.resolve() / ".lab" / "demo"
