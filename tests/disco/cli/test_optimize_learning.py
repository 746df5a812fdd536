"""``disco optimize``'s funnel flags: rounds, learning and where the machine's correction is kept."""

from __future__ import annotations

import pytest


@pytest.mark.fast
@pytest.mark.parametrize("flags, learn, path", [
    ([], True, "ENV"),
    (["--correction", "mine.json"], True, "mine.json"),
    (["--no-keep-correction"], True, None),
    (["--no-learn", "--correction", "mine.json"], False, None),
])
def test_the_funnel_flags_make_the_config(monkeypatch, tmp_path, flags, learn, path):
    from disco import cli
    from disco.cli.optimize import config_from_args

    monkeypatch.setenv("DISCO_CORRECTIONS", str(tmp_path / "env.json"))
    args = cli.build_parser().parse_args(["optimize", "--model", "mlp", "--measure-rounds", "2", *flags])
    config = config_from_args(args)
    assert config.measure_rounds == 2 and config.learn is learn
    assert config.correction_file == (str(tmp_path / "env.json") if path == "ENV" else path)


@pytest.mark.fast
def test_a_bad_measure_rounds_is_named_by_its_flag():
    from disco import cli
    from disco.cli.common import CliError
    from disco.cli.optimize import config_from_args

    args = cli.build_parser().parse_args(["optimize", "--model", "mlp", "--measure-rounds", "0"])
    with pytest.raises(CliError, match="--measure-rounds: expected an integer >= 1, got 0"):
        config_from_args(args)


@pytest.mark.fast
def test_the_memory_limit_flag_reads_a_size_and_names_itself_when_it_is_none():
    from disco import cli
    from disco.cli.common import CliError
    from disco.cli.optimize import config_from_args

    args = cli.build_parser().parse_args(["optimize", "--model", "mlp", "--memory-limit", "2GB"])
    assert config_from_args(args).memory_limit == 2 * 10**9
    assert config_from_args(cli.build_parser().parse_args(["optimize", "--model", "mlp"])).memory_limit is None
    args = cli.build_parser().parse_args(["optimize", "--model", "mlp", "--memory-limit", "lots"])
    with pytest.raises(CliError, match=r"--memory-limit: expected a size such as 2GB"):
        config_from_args(args)
