"""Options declared once: what each command line parses, with nothing given, is the options
dataclass's own defaults, so the code and `--help` cannot disagree; and the CA folder has one rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import pytest

from noisefloor.analyzer.analysis import Settings
from noisefloor.analyzer.analyze_options import AnalyzeOptions
from noisefloor.analyzer.analyze_options import from_cli as analyze_from_cli
from noisefloor.analyzer.cli import analyze_cmd
from noisefloor.proxy import cli as proxy_cli
from noisefloor.proxy.cli.options import DEFAULT_STORE, ServeOptions, default_confdir, from_cli


def _params(command: click.Command, args: list[str]) -> dict:
    with command.make_context(command.name, args) as ctx:
        return dict(ctx.params)


def test_nfproxy_run_parses_to_the_dataclass_defaults_and_one_ca_rule(tmp_path, monkeypatch):
    o = from_cli(**_params(proxy_cli.main.commands["run"], []))
    assert o.labels.session.startswith("run-")  # generated per run
    assert replace(o, labels=ServeOptions().labels) == ServeOptions()
    assert o.ca_dir == (DEFAULT_STORE.parent / "mitmproxy-ca").absolute()
    monkeypatch.chdir(tmp_path)
    o = from_cli(**_params(proxy_cli.main.commands["run"], ["--store", "rel/s.lmdb", "--max-body-mb", "2", "--replay-timing", "recorded",
                                           "--replay-log-in-store", "--listen", "[::1]:0", "--", "echo", "hi"]))
    assert o.ca_dir == tmp_path / "rel" / "mitmproxy-ca" and o.ca_dir.is_absolute()  # a command may change directory
    assert (o.max_body, o.replay_timed, o.replay_log, o.host, o.port, o.command) == (
        2 << 20, True, Path("rel/s.lmdb"), "::1", 0, ("echo", "hi"))
    ca = next(p for p in proxy_cli.main.commands["ca"].params if p.name == "confdir")
    assert ca.default == default_confdir(DEFAULT_STORE)  # `nfproxy ca` looks where `nfproxy run` keeps it
    with pytest.raises(click.BadParameter, match="POINTER=VALUE"):
        from_cli(**_params(proxy_cli.main.commands["run"], ["--set", "temperature"]))


def test_nfanalyze_parses_to_the_analysis_defaults():
    o = analyze_from_cli(**_params(analyze_cmd, ["--example"]))
    assert o == AnalyzeOptions(example=True) and o.settings() == Settings()
    o = analyze_from_cli(**_params(analyze_cmd, ["x.lmdb", "--contrast", "live:t0", "--compare-batches", "a", "b",
                                                 "--delta", "0.1"]))
    assert o.settings().contrasts == (("live", "t0"),) and o.settings().batches == ("a", "b")
    assert o.settings().plan.delta == 0.1 and o.logs == (Path("x.lmdb"),)
    with pytest.raises(click.UsageError, match="give --outcomes"):
        analyze_from_cli(**_params(analyze_cmd, []))
    with pytest.raises(click.BadParameter, match="is not A:B"):
        analyze_from_cli(**_params(analyze_cmd, ["--example", "--contrast", "live"]))


def test_readers_help_for_max_body_speaks_of_reading_not_of_forwarding():
    """show, log, export and nfview only read a store: their --max-body-mb help says what a reader
    does with a larger body, never what the recording proxy does (413, not forwarded)."""
    from noisefloor.viewer.cli import main as nfview

    readers = [proxy_cli.main.commands[name] for name in ("show", "log", "export")] + [nfview]
    for command in readers:
        (option,) = [p for p in command.params if p.name == "max_body_mb"]
        assert "413" not in option.help and "forwarded" not in option.help, command.name
        assert "read" in option.help, command.name
    (run_option,) = [p for p in proxy_cli.main.commands["run"].params if p.name == "max_body_mb"]
    assert "413" in run_option.help  # the proxy itself does answer a larger request body with 413


@pytest.mark.parametrize("listen", ["[::1", "::1]:80", "::1:8080", "[]:80", "[[::1]]:80", "[::1]x:80"])
def test_a_listen_address_with_a_broken_ipv6_host_is_named_as_given(listen):
    from noisefloor.proxy.cli.options import parse_listen

    with pytest.raises(click.BadParameter, match="brackets|is not HOST:PORT") as got:
        parse_listen(listen)
    assert repr(listen) in str(got.value)


@pytest.mark.parametrize(("listen", "want"), [("[::1]:8080", ("::1", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)),
                                              ("localhost:9", ("localhost", 9))])
def test_a_listen_address_is_read_as_host_and_port(listen, want):
    from noisefloor.proxy.cli.options import parse_listen

    assert parse_listen(listen) == want
