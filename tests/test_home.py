"""`AUTOTUNE_HOME`: read when a path is needed, not at import, and the default store follows it."""

from orchestrator.home import autotune_home, default_tracking_uri, home_path
from orchestrator.registry import resolve_tracking_uri


def test_home_is_read_at_call_time(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOTUNE_HOME", raising=False)
    assert str(autotune_home()) == ".autotune"
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "state"))
    assert home_path("calibrations", "x") == tmp_path / "state" / "calibrations" / "x"


def test_the_default_store_lives_under_the_home_unless_a_uri_is_given(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path))
    assert resolve_tracking_uri(None) == default_tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert resolve_tracking_uri(None) == "http://mlflow:5000"
    assert resolve_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"
