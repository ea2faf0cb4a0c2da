"""The provenance docs/results/ keeps: the command as the user typed it."""

from pipelines.common.provenance import command_line, provenance


def test_a_module_run_is_named_as_python_dash_m():
    argv = ["/repo/pipelines/evaluate/generalisation.py", "--config", "x.yaml"]
    assert command_line(argv, "pipelines.evaluate.generalisation") == (
        "python -m pipelines.evaluate.generalisation --config x.yaml"
    )
    assert command_line(["/repo/pipelines/traces/__main__.py", "-v"], "pipelines.traces.__main__") == (
        "python -m pipelines.traces -v"
    )


def test_a_script_is_named_by_its_file():
    assert command_line(["/venv/bin/specexit", "demo", "--json"], None) == "specexit demo --json"


def test_provenance_has_its_four_fields():
    p = provenance("cmd")
    assert p["command"] == "cmd" and p["commit"] and p["machine"] and p["date"].endswith("Z")
