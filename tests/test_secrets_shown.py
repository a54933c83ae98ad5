"""A secret this run read is shown nowhere, whichever path quoted it: a host step that echoed its stdin,
an error cut in the middle of a secret, --debug's traceback, JSON, progress lines, the log file; and in
the spellings an error quotes it in (JSON, Python's repr)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from unittest import mock

import pytest

import fleet.cli as cli_module
from fleet import log
from fleet.control.sweep import _probe
from fleet.errors import HostStepError
from fleet.events import JsonLines, LogLine
from fleet.host.common import http_request
from fleet.hostscripts import answer_of, run_step
from fleet.secrets import hide, read_secrets, redact, remember
from fleet.step_answers import ACT
from fleet.transport.base import CommandResult
from fleet.transport.local import LocalTransport

SECRET = "hf_SECRETvalue123"


def echoing_python(tmp_path: Path) -> str:
    """A "Python" on the host that answers any step by printing what it was sent on stdin."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\ncat\necho oops\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def no_piece_of(secret: str, text: str) -> bool:
    return not any(secret[i : i + 6] in text for i in range(len(secret) - 5))


@pytest.mark.parametrize("value", ['ab"cd\\ef-g', "sk-KEY9999\r", "tab\there", "naïve-kéy"])
def test_a_secret_is_redacted_as_json_and_repr_quote_it(value: str) -> None:
    for text in (json.dumps({"k": value}), repr(value), repr(value.encode()) if value.isascii() else value):
        assert redact(f"said {text} then", {"K": value}).count("***") == 1, text


def test_a_step_that_echoes_its_secrets_is_quoted_without_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    sent = read_secrets(["HF_TOKEN"], "p")  # what a deploy reads is what every output hides
    with pytest.raises(HostStepError) as err:
        run_step(
            LocalTransport("h"),
            echoing_python(tmp_path),
            ACT,
            {"op": "x"},
            stdin=json.dumps(sent).encode(),
            timeout_s=30,
        )  # type: ignore[typeddict-item]
    assert "***" in err.value.message and SECRET not in err.value.message
    assert SECRET not in err.value.remote_traceback


def test_a_cut_through_a_secret_leaves_no_piece_of_it() -> None:
    remember({"K": SECRET})
    for shift in range(len(SECRET)):  # the 300 characters quoted start anywhere inside the secret
        text = SECRET + "x" * (300 - len(SECRET) + shift)
        with pytest.raises(HostStepError) as err:
            answer_of("h", "act", CommandResult(1, text.encode(), b""))
        assert no_piece_of(SECRET, err.value.message), shift


def test_a_steps_own_error_and_traceback_are_hidden_too() -> None:
    remember({"K": SECRET})
    said = json.dumps({"error": f"bad key {SECRET}", "traceback": f"line 1\nValueError: {SECRET!r}"})
    with pytest.raises(HostStepError) as err:
        answer_of("h", "act", CommandResult(1, said.encode(), b""))
    assert SECRET not in err.value.message + err.value.remote_traceback


@pytest.mark.parametrize("garbage", ["[" * 100_000, "42", '"a string"', "null"])
def test_an_answer_that_is_no_json_object_is_the_steps_failure(garbage: str) -> None:
    with pytest.raises(HostStepError, match="said no result"):
        answer_of("h", "act", CommandResult(0, garbage.encode(), b""))


def test_the_cli_prints_an_error_and_its_debug_traceback_without_the_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    remember({"K": SECRET})
    error = HostStepError(f"h: it said {SECRET}", f"hint {SECRET}", f"traceback {SECRET}")
    with mock.patch.object(cli_module.cli, "main", side_effect=error):
        assert cli_module.main(["status"]) == error.exit_code
        with pytest.raises(HostStepError) as raised:
            cli_module.main(["--debug", "status"])
    shown = capsys.readouterr()
    assert "***" in shown.err and SECRET not in shown.out + shown.err
    assert SECRET not in str(raised.value) and SECRET not in repr(raised.value.args)


def test_json_output_progress_lines_and_the_log_file_hide_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    remember({"K": SECRET})
    from fleet.cli.base import emit_json, say

    emit_json({"why": f"the host said {SECRET}"})
    say(f"plain {SECRET}")
    stream = io.StringIO()
    JsonLines("h", stream)(LogLine(f"engine echoed {SECRET}"))
    log.configure(json_file=tmp_path / "fleet.log")
    try:
        log.get(host="h").info("said", text=f"it was {SECRET}")
    finally:
        log.configure()
    shown = capsys.readouterr()
    everything = shown.out + shown.err + stream.getvalue() + (tmp_path / "fleet.log").read_text()
    assert everything.count("***") == 4 and SECRET not in everything


def test_a_key_with_a_line_end_is_not_quoted_by_the_request_that_refused_it() -> None:
    status, said, _ = http_request("GET", "http://127.0.0.1:9/health", headers={"Authorization": f"Bearer {SECRET}\r"})
    assert status is None and SECRET not in said and "line end" in said


def test_the_health_probe_that_echoes_its_keys_is_quoted_without_them(tmp_path: Path) -> None:
    options = mock.Mock(generation_timeout_s=5)
    said = _probe(LocalTransport("h"), mock.Mock(), {}, echoing_python(tmp_path), options, {"served": SECRET})  # type: ignore[arg-type]
    assert "probe_error" in said and SECRET not in json.dumps(said)


def test_nothing_is_hidden_before_a_secret_is_read() -> None:
    assert hide(f"value {SECRET}") == f"value {SECRET}"


def test_json_stays_json_when_a_secret_reads_like_a_number_or_a_word_of_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleet.cli.base import emit_json

    remember({"PIN": "30000", "FLAG": "true"})
    emit_json({"port": 30000, "ok": True, "said": "listening on 30000, true", "n": [1, None]})
    shown = json.loads(capsys.readouterr().out)  # still JSON: strings hidden, not the text
    assert shown == {"port": 30000, "ok": True, "said": "listening on ***, ***", "n": [1, None]}


def test_a_credential_whose_shape_names_it_is_hidden_though_this_run_never_read_it() -> None:
    """`fleet logs` from a shell without the deployment's HF_TOKEN showed the token an engine echoed:
    only secrets a run read are known by value. Hugging Face, `sk-` and GitHub tokens are known by shape;
    names and words that merely start alike are left as they are."""
    echoed = "[hostile] HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 key=sk-proj-" + "x1" * 16
    assert hide(echoed) == "[hostile] HF_TOKEN=*** key=***"
    assert hide("ghp_" + "a1" * 18) == "***"
    for key in ("sk-proj-riGp_58WAm-dX3a" + "Qz9" * 12, "sk-ant-api03-" + "Ab_-9" * 18, "sk-svcacct-" + "x7" * 24):
        assert hide(f"key={key} end") == "key=*** end", key  # every part, dashes and underscores too
    kept = "hf_internal_testing_tiny_random_model from task-abcdefghijklmnopqrstuvwxyz01 on disk-abcdefghijklmnopqrstu"
    assert hide(kept) == kept


def test_a_name_with_a_credential_word_inside_is_not_a_credential_flag() -> None:
    """A container named fleet-hostile-secret had the image after it masked as the flag's value."""
    from fleet.secrets import mask_credentials

    shown = mask_credentials("container fleet-hostile-secret (localhost/img:1) --api-key abc")
    assert shown == "container fleet-hostile-secret (localhost/img:1) --api-key ***"


def test_cron_json_and_fleet_logs_hide_credential_shapes_and_an_engines_own_key_though_none_was_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run that read no secret (cron's `health --json`, `fleet logs` from a shell without the playbook's
    variables) printed an echoed `hf_` token in its JSON, and SGLang's dump of its own arguments showed
    the engine's API key to anyone who read its log."""
    from fleet.cli.base import emit_json
    from fleet.cli.logs_view import LogsView

    token = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    emit_json({"detail": f"crash_log: OOM {token}"})
    assert token not in capsys.readouterr().out
    view = LogsView({}, raw=False, several=False)
    for dumped in (
        "server_args=ServerArgs(model_path='/models/q', api_key='apikey-Zq9Wx8Ev7Rt6', admin_api_key=None)",
        "server_args={'model_path': '/models/q', 'api_key': 'apikey-Zq9Wx8Ev7Rt6', 'port': 30000}",
        "args: Namespace(host=None, api_key=['apikey-Zq9Wx8Ev7Rt6', 'apikey-2nd'], port=8000)",  # vLLM's keys
        "non-default args: {'model': '/models/q', 'api_key': ['apikey-Zq9Wx8Ev7Rt6']}",
    ):
        shown = view.shown(f"{dumped} {token}")
        assert "apikey-Zq9Wx8Ev7Rt6" not in shown and "apikey-2nd" not in shown and token not in shown
        masked = (
            "api_key='***', admin_api_key=None",
            "'api_key': '***'",
            "api_key=['***', '***']",
            "'api_key': ['***']",
        )
        assert any(k in shown for k in masked), shown
