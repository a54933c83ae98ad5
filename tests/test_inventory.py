"""Inventory and playbook validation: every bad file gets `file:line`, the field, and what to do — before
any connection is made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, run_cli
from fleet.errors import ConfigError
from fleet.inventory import load_inventory, load_playbook

GOOD_HOST = "    address: gpu1\n"

INVENTORY_CASES = [
    # (name, file text, exact message)
    ("bad-yaml", "hosts:\n  a: [\n", "inv.yaml:3: invalid YAML (expected the node content, but found '<stream end>')."),
    ("not-a-mapping", "- a\n- b\n", "inv.yaml:1: the inventory must be a mapping."),
    ("no-hosts", "defaults: {}\n", "inv.yaml:1: no hosts defined."),
    ("unknown-top-key", "hosts:\n  a:\n" + GOOD_HOST + "hostz: {}\n", 'inv.yaml:4: unknown key "hostz".'),
    ("unknown-host-key", "hosts:\n  a:\n    address: gpu1\n    adress: gpu1\n", 'inv.yaml:4: unknown key "adress".'),
    (
        "duplicate-host",
        "hosts:\n  ct129:\n    address: a\n  blackwell:\n    address: b\n  ct129:\n    address: c\n",
        'inv.yaml:6: key "ct129" is listed twice (also line 2).',
    ),
    (
        "port-type",
        "hosts:\n  a:\n    address: gpu1\n    port: twenty-two\n",
        "inv.yaml:4: field \"port\" must be an integer (got 'twenty-two').",
    ),
    (
        "port-range",
        "hosts:\n  a:\n    address: gpu1\n    port: 70000\n",
        'inv.yaml:4: field "port" must be at most 65535 (got 70000).',
    ),
    ("missing-address", "hosts:\n  a:\n    port: 22\n", 'inv.yaml:2: host "a" has no address.'),
    (
        "bad-connection",
        "hosts:\n  a:\n    address: x\n    connection: telnet\n",
        "inv.yaml:4: field \"connection\" must be one of 'ssh', 'local' (got 'telnet').",
    ),
    (
        "unknown-group-member",
        "hosts:\n  a:\n" + GOOD_HOST + "groups:\n  gpu:\n    hosts: [a, b]\n",
        'inv.yaml:6: group "gpu" lists unknown host "b".',
    ),
    (
        "group-vars-unknown-key",
        "hosts:\n  a:\n" + GOOD_HOST + "groups:\n  g:\n    hosts: [a]\n    vars: {colour: 1}\n",
        'inv.yaml:7: unknown key "colour".',
    ),
    ("host-name-shell", "hosts:\n  'a;rm -rf /':\n" + GOOD_HOST, 'inv.yaml:2: host name "a;rm -rf /" is not allowed.'),
    (
        "address-injection",
        "hosts:\n  a:\n    address: 'gpu1; touch /tmp/pwned'\n",
        'inv.yaml:3: field "address" must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes) '
        "(got 'gpu1; touch /tmp/pwned').",
    ),
    (
        "address-option",  # ssh would read it as an option
        "hosts:\n  a:\n    address: '-oProxyCommand=touch'\n",
        'inv.yaml:3: field "address" must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes) '
        "(got '-oProxyCommand=touch').",
    ),
    (
        "address-colon",  # a leading ':' is an IPv6 address or nothing
        "hosts:\n  a:\n    address: ':22'\n",
        'inv.yaml:3: field "address" must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes) '
        "(got ':22').",
    ),
    (
        "address-ipv6-long",  # the wildcard and ::1 have one spelling each, as fleet compares them
        "hosts:\n  a:\n    address: x\n    bind_address: '0:0:0:0:0:0:0:0'\n",
        "inv.yaml:4: field \"bind_address\" is an IPv6 address: write it as :: (got '0:0:0:0:0:0:0:0').",
    ),
    (
        "state-dir-traversal",
        "hosts:\n  a:\n    address: x\n    state_dir: /var/lib/../../etc\n",
        "inv.yaml:4: field \"state_dir\" must not contain '..' components (got '/var/lib/../../etc').",
    ),
    (
        "relative-log-dir",
        "hosts:\n  a:\n    address: x\n    log_dir: logs\n",
        'inv.yaml:4: field "log_dir" must be an absolute path (or start with ~/) made of letters, digits and ._/+@- '
        "(got 'logs').",
    ),
    ("anchor-bomb", "x: &a [1, 2]\ny: *a\nhosts: {}\n", "inv.yaml:1: YAML anchors and aliases are not supported."),
    ("deep-nesting", "hosts: " + "[" * 40000 + "]" * 40000 + "\n", "inv.yaml:1: nested more than 32 levels deep."),
    ("custom-tag", "hosts:\n  a: !custom {address: x}\n", "inv.yaml:2: YAML tags (!custom) are not supported."),
    (
        "python-tag",
        "hosts:\n  a:\n    address: !!python/name:os.system x\n",
        "inv.yaml:3: YAML tags (tag:yaml.org,2002:python/name:os.system) are not supported.",
    ),
    (
        "gpu-devices-not-nvidia",
        "hosts:\n  a:\n    address: x\n    gpu_devices: /dev/nul[l]\n",
        'inv.yaml:4: field "gpu_devices" must name NVIDIA device files (their names start with nvidia), such as '
        "/dev/nvidia* (got '/dev/nul[l]').",
    ),
    (
        "kill-policy",
        "hosts:\n  a:\n    address: x\n    kill_policy: always\n",
        "inv.yaml:4: field \"kill_policy\" must be one of 'safe', 'force' (got 'always').",
    ),
    (
        "error-from-defaults",
        "defaults:\n  port: -1\nhosts:\n  a:\n" + GOOD_HOST,
        'inv.yaml:2: field "port" must be at least 1 (got -1).',
    ),
    (
        "group-host-clash",
        "hosts:\n  a:\n" + GOOD_HOST + "groups:\n  a:\n    hosts: [a]\n",
        'inv.yaml:5: group "a" has the same name as a host (line 2).',
    ),
    (
        "engine-unknown",
        "hosts:\n  a:\n    address: x\n    engines: {tgi: /usr/bin/python3}\n",
        "inv.yaml:4: field \"engines\" has a key that must be one of 'sglang', 'vllm' (got 'tgi').",
    ),
    (
        "port-bool",
        "hosts:\n  a:\n    address: x\n    port: true\n",
        'inv.yaml:4: field "port" must be an integer (got True).',
    ),
    (
        "timeout-zero",
        "hosts:\n  a:\n    address: x\n    connect_timeout_s: 0\n",
        'inv.yaml:4: field "connect_timeout_s" must be greater than 0 (got 0).',
    ),
    (
        "expected-gpus-not-a-mapping",
        "hosts:\n  a:\n    address: x\n    expected_gpus: 8\n",
        'inv.yaml:4: field "expected_gpus" must be a mapping (got 8).',
    ),
    (
        "expected-gpus-count-missing",
        "hosts:\n  a:\n    address: x\n    expected_gpus: {name_contains: A6000}\n",
        'inv.yaml:4: required field "expected_gpus.count" is missing.',
    ),
    (
        "expected-gpus-count-zero",
        "hosts:\n  a:\n    address: x\n    expected_gpus:\n      count: 0\n",
        'inv.yaml:5: field "expected_gpus.count" must be at least 1 (got 0).',
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), INVENTORY_CASES, ids=[c[0] for c in INVENTORY_CASES])
def test_malformed_inventory_names_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert err.value.message == f"{tmp_path}/{message}"
    assert err.value.hint  # every error says what to do


def test_an_ipv6_address_is_an_address(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(
        "hosts:\n  a:\n    address: '::1'\n    bind_address: 'fd00::7'\n    proxy_jump: 'bastion:2222'\n"
        "  b:\n    address: 'fe80::1%eth0'\n    proxy_jump: '[fd00::1]:22'\n"
    )
    hosts = load_inventory(tmp_path / "inv.yaml").hosts
    assert (hosts["a"].settings.address, hosts["a"].settings.bind_address) == ("::1", "fd00::7")
    assert (hosts["a"].settings.proxy_jump, hosts["b"].settings.proxy_jump) == ("bastion:2222", "[fd00::1]:22")
    for bad, said in [("FD00::1", "write it as fd00::1"), ("fe80::1%", "must be a host name"),
                      ("::ffff:a00:1", "write it as ::ffff:10.0.0.1")]:  # fmt: skip
        (tmp_path / "bad.yaml").write_text(f"hosts:\n  a:\n    address: '{bad}'\n")
        with pytest.raises(ConfigError) as err:
            load_inventory(tmp_path / "bad.yaml")
        assert said in err.value.message, err.value.message


def test_oversized_inventory_is_refused_without_parsing(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("# " + "x" * (2 << 20))
    with pytest.raises(ConfigError, match=r"inv.yaml:1: file is \d+ bytes, larger than"):
        load_inventory(path)


def test_bad_inventory_makes_no_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.transport as transport

    def no_connections(*a: object, **k: object) -> None:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(transport, "connect", no_connections)
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a:\n    address: x\n    prot: 22\n")
    r = run_cli("-i", str(path), "facts", "--host", "a")
    assert r.code == 2
    assert f'{path}:4: unknown key "prot".' in r.err


def test_shipped_inventories_validate() -> None:
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    assert set(inv.hosts) == {"blackwell", "ct129"}
    assert inv.hosts["blackwell"].settings.expected_gpus is not None
    assert inv.hosts["blackwell"].settings.expected_gpus.compute_capability == "12.0"
    assert inv.groups["gpu"] == ("blackwell", "ct129")
    sandbox = load_inventory(ROOT / "inventory" / "sandbox.yaml")
    assert all(h.settings.address and h.settings.address.startswith("127.") for h in sandbox.hosts.values())


def test_group_vars_apply_and_host_vars_win(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults:\n  port: 2200\nhosts:\n  a:\n    address: x\n  b:\n    address: y\n    port: 2201\n"
        "groups:\n  g:\n    hosts: [a, b]\n    vars: {kill_policy: force, port: 2202}\n"
    )
    inv = load_inventory(path)
    assert inv.hosts["a"].settings.port == 2202
    assert inv.hosts["b"].settings.port == 2201
    assert inv.hosts["a"].settings.kill_policy == "force"
    assert [h.name for h in inv.select(["g"])] == ["a", "b"]


PLAYBOOK_OK = "engine: sglang\nmodel: M\nserved_name: m\nsmoke:\n  prompt: hi\n  expect: hello\n"
PLAYBOOK_CASES = [
    ("gpus-zero", PLAYBOOK_OK + "gpus: 0\n", 'pb.yaml:7: field "gpus" must be at least 1 (got 0).'),
    (
        "served-name-newline",
        PLAYBOOK_OK.replace("served_name: m", 'served_name: "m\\n"'),
        "pb.yaml:3: field \"served_name\" must be letters, digits and ._:/- (at most 128) (got 'm\\n').",
    ),
    (
        "gpus-empty",
        PLAYBOOK_OK + "gpus: []\n",
        'pb.yaml:7: field "gpus" lists no GPU; list indices as nvidia-smi numbers them (gpus: [0, 1]), give a '
        "count (gpus: 2), gpus: all for every GPU of the host, gpus: fit for as many as the model needs, or leave "
        "it out for the host's free GPUs.",
    ),
    ("gpus-twice", PLAYBOOK_OK + "gpus: [1, 2, 1]\n", 'pb.yaml:7: field "gpus" lists GPU 1 more than once.'),
    ("gpus-negative", PLAYBOOK_OK + "gpus: [-1]\n", 'pb.yaml:7: field "gpus.0" must be at least 0 (got -1).'),
    (
        "gpus-word",
        PLAYBOOK_OK + "gpus: every\n",
        "pb.yaml:7: field \"gpus\" must be 'fit', 'all', an integer or a list (got 'every').",
    ),
    (
        "gpus-in-env",
        PLAYBOOK_OK + "env: {CUDA_VISIBLE_DEVICES: '0'}\n",
        'pb.yaml:7: field "env" sets CUDA_VISIBLE_DEVICES, which fleet sets from gpus:; place the deployment '
        "with gpus: instead.",
    ),
    (
        "missing-engine",
        "model: M\nserved_name: m\nsmoke: {prompt: a, expect: bcd}\n",
        'pb.yaml:1: required field "engine" is missing.',
    ),
    (
        "unknown-engine",
        PLAYBOOK_OK.replace("sglang", "tgi"),
        "pb.yaml:1: field \"engine\" must be one of 'sglang', 'vllm' (got 'tgi').",
    ),
    ("unknown-key", PLAYBOOK_OK + "speculatve: true\n", 'pb.yaml:7: unknown key "speculatve".'),
    (
        "mem-fraction",
        PLAYBOOK_OK + "mem_fraction: 1.5\n",
        'pb.yaml:7: field "mem_fraction" must be less than 1 (got 1.5).',
    ),
    ("tp-zero", PLAYBOOK_OK + "tp: 0\n", 'pb.yaml:7: field "tp" must be at least 1 (got 0).'),
    (
        "negative-port",
        PLAYBOOK_OK + "port: -5\n",
        'pb.yaml:7: field "port" must be at least 1024 (got -5).',
    ),
    (
        "extra-args-injection",
        PLAYBOOK_OK + "extra_args: ['--x', '$(touch /tmp/pwned)']\n",
        "pb.yaml:7: field \"extra_args\" contains characters fleet refuses to send to a host: '$'.",
    ),
    (
        "env-backticks",
        PLAYBOOK_OK + "env: {A: '`id`'}\n",
        "pb.yaml:7: field \"env\" contains characters fleet refuses to send to a host: '`'.",
    ),
    ("env-name", PLAYBOOK_OK + "env: {'A B': x}\n", "pb.yaml:7: field \"env\" has an invalid variable name 'A B'."),
    (
        "served-name-newline",
        PLAYBOOK_OK.replace("served_name: m", 'served_name: "m\\nrm -rf /"'),
        "pb.yaml:3: field \"served_name\" must be letters, digits and ._:/- (at most 128) (got 'm\\nrm -rf /').",
    ),
    (
        "model-traversal",
        PLAYBOOK_OK.replace("model: M", "model: ../../etc"),
        "pb.yaml:2: field \"model\" must not contain '..' components (got '../../etc').",
    ),
    (
        "bad-regex",
        PLAYBOOK_OK.replace("expect: hello", "expect: '('"),
        'pb.yaml:6: field "smoke.expect" is not a valid regular expression (missing ), unterminated subpattern at '
        "position 0) (got '(').",
    ),
    (  # hung deploy and left a host process spinning at 100% CPU
        "catastrophic-expect",
        PLAYBOOK_OK.replace("expect: hello", "expect: '^(.|.|.)*\\d$'"),
        'pb.yaml:6: field "smoke.expect" repeats a group that itself repeats or has alternatives (like (a+)+ or '
        "(.|.)*), which can take hours to match; write it without the nested repetition (got '^(.|.|.)*\\\\d$').",
    ),
    (
        "empty-prompt",
        PLAYBOOK_OK.replace("prompt: hi", "prompt: ''"),
        "pb.yaml:5: field \"smoke.prompt\" must not be empty (got '').",
    ),
    (
        "args-not-a-list",
        PLAYBOOK_OK + "extra_args: --x\n",
        "pb.yaml:7: field \"extra_args\" must be a list (got '--x').",
    ),
    ("args-item", PLAYBOOK_OK + "extra_args: [--x, 2]\n", 'pb.yaml:7: field "extra_args.1" must be a string (got 2).'),
    (
        "args-huge-item",
        PLAYBOOK_OK + "extra_args: [--chat-template, '" + "x" * 50000 + "']\n",
        'pb.yaml:7: field "extra_args" item 2 is 50000 bytes, more than the 4096 a flag may take; put long values '
        "(templates, JSON) in a file on the host and pass its path.",
    ),
    (  # the engine would listen on 22 while fleet checked, stopped for and probed port: 30000
        "args-own-port",
        PLAYBOOK_OK + "extra_args: [--tp-size, '2', --port=22]\n",
        'pb.yaml:7: field "extra_args" sets --port, which fleet sets itself; use port: instead.',
    ),
    (
        "args-own-host",
        PLAYBOOK_OK + "extra_args: [--host, 0.0.0.0]\n",
        'pb.yaml:7: field "extra_args" sets --host, which fleet sets itself; use bind_address: in the inventory '
        "instead.",
    ),
    (  # argparse reads an unambiguous prefix as the flag
        "args-own-port-prefix",
        PLAYBOOK_OK + "extra_args: [--por, '22']\n",
        'pb.yaml:7: field "extra_args" sets --port, which fleet sets itself; use port: instead.',
    ),
    (
        "args-own-model",
        PLAYBOOK_OK + "extra_args: [--model, /etc]\n",
        'pb.yaml:7: field "extra_args" sets --model, which fleet sets itself; use model: instead.',
    ),
    (
        "speculative-steps",
        PLAYBOOK_OK + "speculative:\n  steps: 99\n",
        'pb.yaml:8: field "speculative.steps" must be at most 16 (got 99).',
    ),
    (
        "env-loader",
        PLAYBOOK_OK + "env:\n  NCCL_DEBUG: INFO\n  LD_PRELOAD: /tmp/x.so\n",
        'pb.yaml:9: field "env.LD_PRELOAD" sets LD_PRELOAD, which changes what program, library or startup code '
        "runs; if that is intended, list it in allow_runtime_env: [LD_PRELOAD] too.",
    ),
    (
        "env-path",
        PLAYBOOK_OK + "env: {PATH: /nonexistent}\nallow_runtime_env: [PYTHONPATH]\n",
        'pb.yaml:7: field "env.PATH" sets PATH, which changes what program, library or startup code '
        "runs; if that is intended, list it in allow_runtime_env: [PATH] too.",
    ),
    (
        "env-home",
        PLAYBOOK_OK + "env: {HOME: /tmp/evilhome}\n",
        'pb.yaml:7: field "env.HOME" sets HOME, which changes what program, library or startup code '
        "runs; if that is intended, list it in allow_runtime_env: [HOME] too.",
    ),
    (
        "parsers-word",
        PLAYBOOK_OK + "parsers: always\n",
        "pb.yaml:7: field \"parsers\" must be 'auto' or a mapping (got 'always').",
    ),
    (
        "parsers-name",
        PLAYBOOK_OK + 'parsers:\n  reasoning: "qwen3; rm -rf /"\n',
        'pb.yaml:8: field "parsers.reasoning" must be an engine\'s parser name: letters, digits and ._- (at most '
        "64), e.g. qwen3 (got 'qwen3; rm -rf /').",
    ),
    (
        "on-stall-word",
        PLAYBOOK_OK + "on_stall: retry\n",
        "pb.yaml:7: field \"on_stall\" must be one of 'fail', 'wait' (got 'retry').",
    ),
    (
        "secret-env-loader",
        PLAYBOOK_OK + "secret_env: [HF_TOKEN, BASH_ENV]\n",
        'pb.yaml:7: field "secret_env" sets BASH_ENV, which changes what program, library or startup code '
        "runs; if that is intended, list it in allow_runtime_env: [BASH_ENV] too.",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), PLAYBOOK_CASES, ids=[c[0] for c in PLAYBOOK_CASES])
def test_malformed_playbook_names_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / "pb.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_playbook(str(path), tmp_path)
    assert err.value.message == f"{tmp_path}/{message}"


@pytest.mark.parametrize(
    "expect",
    ["Paris|", "|Paris", "(Paris)?", ".", "(?s).", ".*", "\\s*", "[^X]", "\\W|Paris", "e", "(?i)hi", "4", "a|bc"],
)
def test_a_smoke_expect_that_an_empty_or_garbage_answer_satisfies_is_refused(tmp_path: Path, expect: str) -> None:
    """It proves nothing: a server answering noise would be "up" (issue 39: `Paris|` was accepted)."""
    path = tmp_path / "pb.yaml"
    path.write_text(PLAYBOOK_OK.replace("expect: hello", f"expect: {json.dumps(expect)}"))
    with pytest.raises(ConfigError) as err:
        load_playbook(str(path), tmp_path)
    assert err.value.message.startswith(f"{path}:4: ") and "matches an answer that says nothing" in err.value.message
    path.write_text(PLAYBOOK_OK.replace("expect: hello", f"expect: {json.dumps(expect)}\n  any_answer: true"))
    assert load_playbook(str(path), tmp_path).spec.smoke.any_answer  # said in so many words: random weights


@pytest.mark.parametrize(
    ("written", "char"),
    [
        ('served_name: "m\\u202e"', "U+202E (RIGHT-TO-LEFT OVERRIDE)"),  # a YAML escape
        ("served_name: m\u200b", "U+200B (ZERO WIDTH SPACE)"),  # written as is
        ('served_name: "m\\x9b"', "U+009B"),  # a C1 control: a CSI on some terminals
        ('served_name: "m\\x7f"', "U+007F"),
        ('served_name: m\nextra_args: ["--x\\u2066"]', "U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ],
)
def test_a_value_with_an_invisible_or_control_character_is_refused_with_its_line(
    tmp_path: Path, written: str, char: str
) -> None:
    """`fleet plan` printed C1 controls, bidi overrides and zero-width characters from playbook values
    (only C0 controls were refused): a value must show as what it is (issue 39)."""
    path = tmp_path / "pb.yaml"
    path.write_text(PLAYBOOK_OK.replace("served_name: m", written))
    with pytest.raises(ConfigError) as err:
        load_playbook(str(path), tmp_path)
    assert err.value.message.startswith(f"{path}:") and char in err.value.message, err.value.message


def test_runtime_changing_environment_is_accepted_when_opted_in(tmp_path: Path) -> None:
    path = tmp_path / "pb.yaml"
    path.write_text(
        PLAYBOOK_OK + "env: {LD_LIBRARY_PATH: /opt/cuda/lib64, PATH: /opt/bin}\n"
        "allow_runtime_env: [LD_LIBRARY_PATH, PATH]\n"
    )
    assert load_playbook(str(path), tmp_path).spec.env["PATH"] == "/opt/bin"


def test_an_unknown_nested_key_lists_the_keys_known_there(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a:\n    address: x\n    expected_gpus: {count: 2, colour: red}\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert err.value.message == f'{path}:4: unknown key "expected_gpus.colour".'
    assert err.value.hint == "Known keys: compute_capability, count, name_contains."


def test_unknown_playbook_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        load_playbook("qwen99", ROOT / "playbooks")
    assert "qwen35-nvfp4, qwen35-nvfp4-handwritten, qwen35-two-nodes, qwen36-27b" in err.value.hint


def test_shipped_playbooks_validate() -> None:
    for path in (ROOT / "playbooks").glob("*.yaml"):
        pb = load_playbook(path.stem, ROOT / "playbooks")
        assert pb.spec.smoke.prompt


# Exit 2 for bad input, except `fleet health`: Nagios reads a check that could not run as unknown (3).
CLI_CASES = [
    (["deploy", "qwen36-27b", "--host", "ct129", "--gpus", "0"], 2, "--gpus 0: a deployment needs at least one GPU"),
    (["deploy", "qwen36-27b", "--host", "ct129", "--gpus", "1,1"], 2, "a GPU is listed twice"),
    (["deploy", "qwen36-27b", "--host", "ct129", "--gpus", "0;touch /tmp/fleet-canary"], 2, "not a GPU count"),
    (["deploy", "qwen36-27b", "--host", "ct129", "--name", "a/b"], 2, "'a/b' is not a deployment name"),
    (
        ["deploy", "qwen36-27b", "--host", "ct129", "--name", "$(touch /tmp/fleet-canary)"],
        2,
        "is not a deployment name",
    ),
    (["stop", "--host", "ct129/../x"], 2, "'../x' is not a deployment name"),
    (["deploy", "qwen36-27b", "--host", "ct129", "--gpus", "\u0663,\u0664"], 2, "not a GPU count"),  # Arabic-Indic 3,4
    (["deploy", "qwen36-27b", "--host", "ct129", "--gpus", "\u00b2"], 2, "not a GPU count"),  # superscript 2
    (["deploy", "qwen36-27b", "--host", "ct129", "--name", "x\n"], 2, "'x\\n' is not a deployment name"),
    (["restart", "--host", "ct129/a", "--name", "b"], 2, "--host names deployment 'a' and --name 'b'"),
    (
        ["facts", "--host", "ct129; touch /tmp/fleet-canary"],
        2,
        'no host or group named "ct129; touch /tmp/fleet-canary"',
    ),
    (["facts", "--host", "$(touch /tmp/fleet-canary)"], 2, "no host or group named"),
    (["deploy", "qwen36-27b; touch /tmp/fleet-canary"], 2, "fleet-canary: cannot read (No such file or directory)"),
    (["deploy", "qwen36-27b;touch"], 2, "not a valid playbook name"),
    (["deploy", "../../../../etc/hostname"], 2, "a playbook must be a mapping"),
    (["logs", "--host", "ct129", "-n", "-5"], 2, "-5 is not in the range"),
    (["health", "--deadline", "-1"], 3, "-1.0 is not in the range"),
    (["health", "--max-heals-per-hour", "1000"], 3, "1000 is not in the range"),
    (["diagnose", "/nonexistent/server.log"], 2, "/nonexistent/server.log: cannot read"),
    (["diagnose", "/tmp"], 2, "/tmp: cannot read (Is a directory)"),
]


@pytest.mark.parametrize(("argv", "code", "message"), CLI_CASES, ids=[" ".join(c[0])[:40] for c in CLI_CASES])
def test_hostile_cli_arguments_are_refused_before_any_connection(
    argv: list[str], code: int, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleet.transport as transport

    def no_connections(*a: object, **k: object) -> None:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(transport, "connect", no_connections)
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "--playbooks", str(ROOT / "playbooks"), *argv)
    assert r.code == code and message in r.err + r.out
    assert not Path("/tmp/fleet-canary").exists()


def test_an_inventory_or_playbook_that_is_a_directory_is_named(tmp_path: Path) -> None:
    """Was an IsADirectoryError traceback."""
    r = run_cli("-i", str(tmp_path), "status")
    assert r.code == 2 and f"{tmp_path}: cannot read (Is a directory)." in r.err and "Give the path of a YAML" in r.err
    assert run_cli("-i", str(tmp_path), "health").code == 3
    (tmp_path / "odd.yaml").mkdir()
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "--playbooks", str(tmp_path), "plan", "odd")
    assert r.code == 2 and "odd.yaml: cannot read (Is a directory)." in r.err


class _Connected(Exception):
    pass


def test_a_playbooks_default_host_matters_only_when_no_host_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Playbooks are shared between inventories: default_host "ct129" must not block `--host gpu` in an
    inventory that has no ct129, and without --host the error names the playbook, the inventory and the hosts."""
    import fleet.transport as transport

    def connect(host: Any, options: object) -> None:
        raise _Connected(host.name)

    monkeypatch.setattr(transport, "connect", connect)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  gpu:\n    connection: local\n")
    common = ("-i", str(inventory), "--playbooks", str(ROOT / "playbooks"))
    for command in ("plan", "deploy"):
        with pytest.raises(_Connected, match="^gpu$"):
            run_cli(*common, command, "qwen36-27b", "--host", "gpu")
        r = run_cli(*common, command, "qwen36-27b")
        assert r.code == 2
        assert f'{ROOT}/playbooks/qwen36-27b.yaml: default_host "ct129" is not in {inventory}' in r.err
        assert "Known hosts: gpu." in r.err


def test_libyaml_and_the_python_loader_read_the_same_data_and_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet reads YAML with libyaml when PyYAML has it; what it reads must not depend on that."""
    import yaml

    from fleet import yamlfile

    text = (ROOT / "inventory" / "sandbox.yaml").read_text() + "extra:\n  - {a: 1, b: [x, 'y', 2.5, null, true]}\n"
    fast = yamlfile.parse_yaml(text, Path("inv.yaml"))
    monkeypatch.setattr(yamlfile, "_FAST_LOADER", yaml.SafeLoader)
    slow = yamlfile.parse_yaml(text, Path("inv.yaml"))
    assert fast.data == slow.data and fast.lines == slow.lines
    assert yaml.__with_libyaml__, "PyYAML without libyaml: fleet works, but reads inventories slower"


def test_settings_sent_to_the_pool_are_checked_as_the_inventorys_are() -> None:
    import msgspec

    from fleet.inventory import settings_from

    settings = load_inventory(ROOT / "inventory" / "hosts.yaml").hosts["blackwell"].settings
    assert settings_from(msgspec.to_builtins(settings), "a fleet run") == settings
    tampered = {**msgspec.to_builtins(settings), "address": "gpu1; touch /tmp/pwned"}
    with pytest.raises(ConfigError) as err:
        settings_from(tampered, "a fleet run")
    assert err.value.message.startswith('a fleet run: host setting "address" must be a host name')


def test_a_playbook_whose_name_is_no_deployment_name_is_refused_before_any_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an adversarial pass: once a deploy read the host's facts ahead, such a playbook reached the
    host (a probe, nothing changed) before it was refused."""
    import fleet.transport as transport

    def no_connections(*a: object, **k: object) -> None:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(transport, "connect", no_connections)
    odd = tmp_path / "my qwen!.yaml"
    odd.write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text())
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "deploy", str(odd), "--host", "ct129")
    assert r.code == 2 and "is not a deployment name" in r.err, r.err
