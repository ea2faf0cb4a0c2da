"""`specexit bench hook` at tiny sizes: the last line is the JSON the docs quote."""

import json

from specexit_app.cli import build_parser


def test_bench_hook_json_shape(capsys):
    args = build_parser().parse_args(["bench", "hook", "--json", "--sizes", "1", "4", "--steps", "3"])
    assert args.func(args) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    last = lines[-1]
    assert set(last) == {"hook_us_per_step", "step_us_without_hook"}
    for k in last:
        assert set(last[k]) == {"1", "4"} and all(v > 0 for v in last[k].values())
    setup, detail = lines[-3]["setup"], lines[-2]["detail"]
    assert set(setup["load_average"]) == {"before", "after"}
    for n in ("1", "4"):
        d = detail[n]
        assert (
            0 < d["hook_us_min"] <= d["hook_us_median"] and 0 < d["without_hook_us_min"] <= d["without_hook_us_median"]
        )
        assert 0 < d["hook_cpu_us_min"] <= d["hook_cpu_us_median"] and 0 < d["signals_us_min"] <= d["signals_us_median"]
