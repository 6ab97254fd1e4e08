"""spec.mode.function.asyncInvocations: its defaults, its bounds, its callback's rules (#44)."""

from __future__ import annotations

import textwrap

import pytest

from kruntimes.api import Function, FunctionManifestError, Run
from kruntimes.api.spec import (
    MAX_ASYNC_BACKLOG,
    MAX_ASYNC_RETENTION_SECONDS,
    MAX_CALLBACK_URL_CHARS,
    AsyncCallback,
    AsyncInvocations,
    FunctionMode,
)
from kruntimes.contracts.invocation import InvocationInput, InvocationPolicy, Retry

from .builders import RUN_UID, T0, assert_invalid, make_spec


def test_unset_it_takes_the_documented_defaults() -> None:
    policy = FunctionMode().async_invocations
    assert FunctionMode().asyncInvocations is None
    assert policy.retry.model_dump() == {"onUnknownOutcome": False, "onFailure": False, "maxAttempts": 5}
    assert (policy.share, policy.backlog, policy.retentionSeconds, policy.callback) == (
        50,
        10_000,
        86_400,
        None,
    )


def test_a_full_block_parses_from_a_run_manifest_and_round_trips() -> None:
    block = {
        "retry": {"onUnknownOutcome": True, "onFailure": True, "maxAttempts": 100},
        "share": 100,
        "backlog": MAX_ASYNC_BACKLOG,
        "retentionSeconds": 60,
        "callback": {"url": "https://hooks.example.com:8443/a?b=c", "secretName": "hook-key"},
    }
    spec = make_spec(mode={"function": {"asyncInvocations": block}})
    assert spec.mode.function is not None
    assert spec.mode.function.async_invocations.model_dump(exclude_none=True) == block
    assert type(spec).model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("block", "loc", "says"),
    [
        ({"retry": {"maxAttempts": 0}}, "retry.maxAttempts", "greater than or equal to 1"),
        ({"retry": {"maxAttempts": 101}}, "retry.maxAttempts", "less than or equal to 100"),
        ({"retry": {"maxAttempts": "5"}}, "retry.maxAttempts", "valid integer"),
        ({"retry": {"onFailure": "yes"}}, "retry.onFailure", "valid boolean"),
        ({"retry": {"onFailure": 1}}, "retry.onFailure", "valid boolean"),
        ({"retry": {"onError": True}}, "retry.onError", "Extra inputs"),
        ({"share": 0}, "share", "greater than or equal to 1"),
        ({"share": 101}, "share", "less than or equal to 100"),
        ({"share": 50.0}, "share", "valid integer"),
        ({"backlog": 0}, "backlog", "greater than or equal to 1"),
        ({"backlog": MAX_ASYNC_BACKLOG + 1}, "backlog", "less than or equal to 100000"),
        ({"retentionSeconds": 59}, "retentionSeconds", "greater than or equal to 60"),
        ({"retentionSeconds": MAX_ASYNC_RETENTION_SECONDS + 1}, "retentionSeconds", "less than or equal"),
        ({"retentionSeconds": True}, "retentionSeconds", "valid integer"),
        ({"callback": {}}, "callback.url", "Field required"),
        ({"queue": 3}, "queue", "Extra inputs"),
    ],
)
def test_each_bound_is_refused_at_its_path(block: dict[str, object], loc: str, says: str) -> None:
    assert_invalid(AsyncInvocations, block, loc=loc, says=says)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.example.com/a", "https only"),
        ("ftp://hooks.example.com/a", "https only"),
        ("hooks.example.com/a", "https only"),
        ("https:///a", "names no host"),
        ("https://user:pw@hooks.example.com/a", "must not carry a user or password"),
        ("https://token@hooks.example.com/a", "must not carry a user or password"),
        ("https://hooks.example.com/a#frag", "must not carry a fragment"),
        ("https://hooks.example.com/a b", "printable ASCII without spaces"),
        ("https://hooks.example.com/\u00e9", "printable ASCII without spaces"),
        ("https://hooks.example.com/a\n", "printable ASCII without spaces"),
        ("https://hooks.example.com:99999/a", "not a URL"),
        ("https://hooks.example.com:0/a", "port 0"),
        ("", "1..2048 characters"),
        ("https://h.example.com/" + "a" * MAX_CALLBACK_URL_CHARS, "1..2048 characters"),
    ],
)
def test_a_callback_url_is_https_with_a_host_and_no_credentials(url: str, says: str) -> None:
    assert_invalid(AsyncCallback, {"url": url}, loc="url", says=says)


def test_the_longest_callback_url_and_a_secret_name_pass() -> None:
    url = "https://h.example.com/" + "a" * (MAX_CALLBACK_URL_CHARS - len("https://h.example.com/"))
    assert AsyncCallback(url=url, secretName="k").url == url
    assert AsyncCallback(url="https://[::1]:8443/x").secretName is None


@pytest.mark.parametrize("name", ["Hook", "hook_key", "-a", "a" * 64, ""])
def test_a_callback_secret_name_is_a_dns_label(name: str) -> None:
    assert_invalid(
        AsyncCallback,
        {"url": "https://h.example.com/", "secretName": name},
        loc="secretName",
        says="callback.secretName: a DNS-1123 label",
    )


def test_a_run_manifest_names_the_problem_by_its_path() -> None:
    manifest = textwrap.dedent(
        """\
        apiVersion: kruntimes.io/v1alpha1
        kind: Run
        metadata: {name: echo}
        spec:
          runtime: python
          mode: {function: {asyncInvocations: {callback: {url: "http://x.example.com/"}}}}
          source: {inline: [{name: main.py, content: "def h(x): return x"}]}
          handler: main:h
        """
    )
    with pytest.raises(Exception) as caught:
        Run.from_yaml(manifest)
    assert "spec.mode.function.asyncInvocations.callback.url" in str(caught.value)
    assert "https only" in str(caught.value)


FUNCTION_MANIFEST = textwrap.dedent(
    f"""\
    apiVersion: kruntimes.io/v1alpha1
    kind: Function
    metadata: {{name: echo, namespace: demo, uid: {RUN_UID}}}
    spec:
      runtime: python
      mode:
        function:
          asyncInvocations: {{retry: {{onFailure: true, maxAttempts: 3}}, backlog: 20}}
      source: {{inline: [{{name: main.py, content: "def h(x): return x"}}]}}
      handler: main:h
    """
)


def test_a_functions_template_carries_the_block_to_its_replicas() -> None:
    function = Function.from_yaml(FUNCTION_MANIFEST)
    template = function.spec.template().mode.function
    assert template is not None
    assert template.async_invocations.retry == Retry(onFailure=True, maxAttempts=3)
    assert template.async_invocations.backlog == 20


def test_a_functions_block_out_of_bounds_is_refused_by_path() -> None:
    with pytest.raises(FunctionManifestError) as caught:
        Function.from_yaml(FUNCTION_MANIFEST.replace("backlog: 20", "backlog: 0"))
    assert caught.value.problems[0].startswith("spec.mode.function.asyncInvocations.backlog:")


def test_the_contract_validates_callback_urls_and_secret_names_as_the_spec_does() -> None:
    target = {"kind": "Run", "namespace": "demo", "uid": RUN_UID}
    base = {"target": target, "invocationId": "i-1", "bodySha256": "0" * 64, "body": "{}", "acceptedAt": T0}
    assert InvocationInput.model_validate({**base, "callbackUrl": "https://h.example.com/"}).callbackUrl
    assert_invalid(
        InvocationInput, {**base, "callbackUrl": "http://h.example.com/"}, loc="callbackUrl", says="https"
    )
    assert_invalid(
        InvocationPolicy, {"exists": True, "callbackSecretName": "A"}, loc="callbackSecretName", says=""
    )
