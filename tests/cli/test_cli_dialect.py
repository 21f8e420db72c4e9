"""One CLI dialect: every command that reaches a broker takes the same broker, TLS, credential
and output options; the same thing has one flag name everywhere; sizes read ``64KiB``, ``8MiB``
or plain bytes; old spellings still work, hidden, with a warning; nothing wraps into a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from edgeinfer.cli import app, main
from edgeinfer.cli.broker_options import BrokerOptions, MqttProtocol, broker_options
from edgeinfer.cli.common import parse_size

BROKER_COMMANDS = ("serve", "request", "deploy", "rollback", "rollout")
BROKER_OPTIONS = {
    "--broker", "--device-id", "--topic-prefix", "--client-id", "--protocol",
    "--tls-ca", "--tls-cert", "--tls-key", "--username", "--password", "--password-file",
}  # fmt: skip
# Spellings that name one thing twice across commands: only ever as hidden aliases.
OLD_SPELLINGS = {
    "--v311", "--device", "--chunk-kib", "--reply-cache-mb", "--max-payload-bytes",
    "--kv-budget-mb", "--memory-budget-mb", "--dir",
}  # fmt: skip


def _commands() -> Iterator[tuple[str, typer.core.TyperCommand]]:
    def walk(command: object, path: tuple[str, ...]) -> Iterator[tuple[str, object]]:
        children = getattr(command, "commands", None)
        if not children:
            yield " ".join(path), command
            return
        for name, child in children.items():
            yield from walk(child, (*path, name))

    yield from walk(get_command(app), ())  # type: ignore[misc]


def _visible_options(command: object) -> set[str]:
    params = getattr(command, "params", [])
    return {
        name for p in params if p.param_type_name == "option" and not p.hidden for name in p.opts
    }


def test_every_broker_command_takes_the_same_broker_tls_and_credential_options() -> None:
    commands = dict(_commands())
    missing = {
        name: sorted(BROKER_OPTIONS - _visible_options(commands[name])) for name in BROKER_COMMANDS
    }
    assert missing == {name: [] for name in BROKER_COMMANDS}


def test_the_broker_options_read_the_same_on_every_command() -> None:
    """One declaration: each option's help, default, panel and environment variable match."""

    def described(command: object) -> dict[str, tuple[object, ...]]:
        return {
            p.opts[0]: (p.help, p.default, p.rich_help_panel, p.envvar)
            for p in getattr(command, "params", [])
            if p.param_type_name == "option" and p.opts[0] in BROKER_OPTIONS - {"--device-id"}
        }

    commands = dict(_commands())
    first, *others = [described(commands[name]) for name in (*BROKER_COMMANDS, "fleet status")]
    assert len(first) == len(BROKER_OPTIONS) - 1
    assert all(other == first for other in others)


def test_a_broker_command_gets_its_options_as_one_value() -> None:
    seen: list[BrokerOptions] = []

    @broker_options()
    def command(name: str, *, mqtt: BrokerOptions, json_out: bool = False) -> None:
        seen.append(mqtt)

    command(name="x", broker="mqtts://h:8883", topic_prefix="p", client_id=None,
            protocol=MqttProtocol.v311, connect_timeout_s=3.0, username="u", password="pw",
            password_file=None, tls_ca=None, tls_cert=None, tls_key=None)  # fmt: skip
    connection = seen[0].connection(default_client_id="made", session_expiry_s=60)
    assert (connection.broker, connection.client_id, connection.protocol) == (
        "mqtts://h:8883", "made", "3.1.1",
    )  # fmt: skip
    assert (connection.password, connection.session_expiry_s, seen[0].topic_prefix) == (
        "pw", 60, "p",
    )  # fmt: skip
    assert "pw" not in repr(seen[0])
    with pytest.raises(TypeError, match="mqtt: BrokerOptions"):
        broker_options()(lambda name: None)


def test_no_command_shows_an_old_spelling() -> None:
    shown = {name: sorted(_visible_options(c) & OLD_SPELLINGS) for name, c in _commands()}
    assert {name: found for name, found in shown.items() if found} == {}


def test_every_command_that_reports_takes_json() -> None:
    without = sorted(name for name, c in _commands() if "--json" not in _visible_options(c))
    assert without == []


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64KiB", 64 << 10), ("8MiB", 8 << 20), ("2gib", 2 << 30), ("0", 0)],
)
def test_sizes_read_binary_units_or_bytes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5MiB", "-1", "64KB", "MiB", "9" * 30, "1 lot", "8TiB9"])
def test_a_size_that_is_not_one_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="65536, 64KiB, 8MiB"):
        parse_size(text)


def test_a_huge_size_is_refused() -> None:
    with pytest.raises(ValueError, match="larger than"):
        parse_size("9999999999999999999TiB")


def test_a_bad_size_on_the_command_line_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["deploy", "pkg", "--device-id", "d", "--chunk-size", "lots"]) == 2
    assert "64KiB" in capsys.readouterr().err


def _keys(tmp_path: Path) -> Path:
    assert main(["keygen", "-o", str(tmp_path / "release")]) == 0
    return tmp_path / "release.key"


def test_an_old_spelling_still_works_and_says_which_to_use(
    fast_encoder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tmp_path / "pkg"
    subprocess.run(["cp", "-r", str(fast_encoder), str(package)], check=True)
    key = str(_keys(tmp_path))
    capsys.readouterr()
    assert main(["sign", str(package), "--key", key, "--device", "plc7", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["release"]["devices"] == ["plc7"]
    assert "--device is deprecated; use --device-id" in out.err
    assert main(["sign", str(package), "--key", key, "--device-id", "plc8", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["release"]["devices"] == ["plc8"] and "deprecated" not in out.err


def test_export_reads_preprocessing_from_preprocess_and_old_image_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--image`` is a picture file in classify, detect, segment and profile; export's
    preprocessing is ``--preprocess``. The refusal (ONNX settings with --early-exit) comes
    before any export, after the options were read."""
    export = dict(_commands())["export"]
    assert "--preprocess" in _visible_options(export) and "--image" not in _visible_options(export)
    argv = ["export", "model.onnx", "-o", "pkg", "--early-exit"]
    assert main([*argv, "--image", "color=BGR"]) == 2
    err = capsys.readouterr().err
    assert "--image is deprecated; use --preprocess" in err and "--preprocess and --nms" in err
    assert main([*argv, "--preprocess", "color=BGR"]) == 2
    err = capsys.readouterr().err
    assert "deprecated" not in err and "--preprocess and --nms" in err
    assert main([*argv, "--preprocess", "color=BGR", "--image", "pad=top-left"]) == 2
    assert "give one" in capsys.readouterr().err


def test_both_spellings_at_once_is_a_usage_error(
    fast_encoder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = str(_keys(tmp_path))
    argv = ["sign", str(fast_encoder), "--key", key, "--device-id", "a", "--device", "b"]
    assert main(argv) == 2
    assert "give one" in capsys.readouterr().err


def test_messages_into_a_pipe_do_not_wrap_on_a_long_path(
    fast_encoder: Path, tmp_path: Path
) -> None:
    """A long cache folder printed "3 \\nentries" at 80 (then 120) columns into a pipe."""
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 8)
    deep.mkdir(parents=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            "cache",
            "stats",
            str(fast_encoder),
            "--cache-dir",
            str(deep),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no result cache yet"), done.stderr
    assert str(deep) in lines[0]
