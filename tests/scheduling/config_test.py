"""Platform configuration: defaults, YAML loading and validation errors that name the field."""

from __future__ import annotations

import textwrap

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from kruntimes.config.runtimes import (
    PlatformConfig,
    PlatformConfigError,
    RuntimeConfig,
    TenantConfig,
    load_config,
    parse_config,
)
from kruntimes.decisions.scheduling.model import SHARED_POLICY, TenancyMode, TenantPolicy


def problems(data):
    with pytest.raises(PlatformConfigError) as e:
        parse_config(data)
    assert isinstance(e.value, ValueError)
    return e.value.problems


def runtime_data(**changes):
    return {"runtimes": [{"name": "python", "adapter": "python", **changes}]}


# --- defaults ------------------------------------------------------------------------------------


def test_no_file_gives_python_and_bash_runtimes_with_the_default_pool():
    config = load_config(None)
    assert [(r.name, r.adapter) for r in config.runtimes] == [("python", "python"), ("bash", "bash")]
    for r in config.runtimes:
        assert (r.runs, r.minHosts, r.maxHosts, r.provider) == (10, 0, 4, "process")
        assert r.limits is None
    assert config.tenants == []
    assert config.queueLimit == 1000
    assert config.heartbeatIntervalSeconds == 5.0


def test_no_file_and_an_empty_file_and_an_empty_mapping_are_the_same_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(None) == load_config(empty) == parse_config({}) == PlatformConfig()


def test_runtime_timeouts_have_defaults():
    r = RuntimeConfig(name="python", adapter="python")
    assert (r.scaleInDelaySeconds, r.assignmentTimeoutSeconds, r.invokeTimeoutSeconds) == (300.0, 60.0, 30.0)


# --- loading -------------------------------------------------------------------------------------


def test_a_yaml_file_sets_what_it_names_and_defaults_the_rest(tmp_path):
    path = tmp_path / "kruntimes.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            runtimes:
              - name: py-big
                adapter: python
                runs: 1
                minHosts: 2
                maxHosts: 8
                provider: kubernetes
                kubernetes: {namespace: krt-hosts, podTemplate: {image: "registry.example/krt:1"}}
                invokeTimeoutSeconds: 120
                limits:
                  openFiles: 256
                  addressSpaceBytes: 1073741824
            tenants:
              - name: tenant-a
                mode: Dedicated
                maxHosts: 3
              - name: tenant-b
                mode: Hybrid
                allowSharedFallback: true
                group: enterprise
            queueLimit: 50
            """
        )
    )
    config = load_config(str(path))
    (rt,) = config.runtimes
    assert (rt.name, rt.runs, rt.minHosts, rt.maxHosts, rt.provider) == ("py-big", 1, 2, 8, "kubernetes")
    assert rt.invokeTimeoutSeconds == 120.0
    assert rt.kubernetes is not None and rt.kubernetes.namespace == "krt-hosts"
    assert rt.limits is not None
    assert (rt.limits.openFiles, rt.limits.addressSpaceBytes, rt.limits.cpuSeconds) == (256, 1073741824, 3600)
    assert config.queueLimit == 50
    assert config.heartbeatIntervalSeconds == 5.0
    assert config.tenant_policy("tenant-a") == TenantPolicy(mode=TenancyMode.Dedicated, maxHosts=3)
    assert config.tenant_policy("tenant-b") == TenantPolicy(
        mode=TenancyMode.Hybrid, allowSharedFallback=True, group="enterprise"
    )


def test_a_missing_file_is_a_config_error_naming_the_path(tmp_path):
    with pytest.raises(PlatformConfigError, match="cannot read") as e:
        load_config(tmp_path / "absent.yaml")
    assert "absent.yaml" in e.value.problems[0]


def test_invalid_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("runtimes: [\n")
    with pytest.raises(PlatformConfigError, match="not valid YAML"):
        load_config(path)


def test_a_document_that_is_not_a_mapping_is_refused():
    assert problems([1, 2]) == ("<config>: expected a mapping, got list",)


# --- lookups -------------------------------------------------------------------------------------


def test_a_run_without_a_tenant_gets_the_shared_policy_and_an_unknown_tenant_gets_none():
    config = parse_config({"tenants": [{"name": "tenant-a", "mode": "Dedicated"}]})
    assert config.tenant_policy(None) is SHARED_POLICY
    assert config.tenant_policy("tenant-a") == TenantPolicy(mode=TenancyMode.Dedicated)
    assert config.tenant_policy("tenant-z") is None


def test_runtimes_are_found_by_name():
    config = PlatformConfig()
    bash = config.runtime("bash")
    assert bash is not None
    assert bash.adapter == "bash"
    assert config.runtime("ruby") is None


def test_a_tenant_config_yields_its_policy_without_its_name():
    tenant = TenantConfig(name="tenant-b", mode=TenancyMode.Hybrid, allowSharedFallback=True, maxHosts=2)
    assert tenant.policy() == TenantPolicy(mode=TenancyMode.Hybrid, allowSharedFallback=True, maxHosts=2)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"runs": 0}, "runtimes.0.runs: Input should be greater than or equal to 1"),
        ({"runs": True}, "runtimes.0.runs: Input should be a valid integer"),
        ({"runs": "10"}, "runtimes.0.runs: Input should be a valid integer"),
        ({"minHosts": -1}, "runtimes.0.minHosts: Input should be greater than or equal to 0"),
        ({"maxHosts": 0}, "runtimes.0.maxHosts: Input should be greater than or equal to 1"),
        ({"minHosts": 3, "maxHosts": 2}, "runtimes.0.maxHosts: must be >= minHosts (3), got 2"),
        ({"adapter": "ruby"}, "runtimes.0.adapter: Input should be 'python', 'bash' or 'krm'"),
        ({"name": "Python"}, "runtimes.0.name: a DNS-1123 label"),
        ({"provider": "K8s"}, "runtimes.0.provider: a DNS-1123 label"),
        (
            {"scaleInDelaySeconds": -1},
            "runtimes.0.scaleInDelaySeconds: Input should be greater than or equal to 0",
        ),
        (
            {"assignmentTimeoutSeconds": 0},
            "runtimes.0.assignmentTimeoutSeconds: Input should be greater than 0",
        ),
        (
            {"invokeTimeoutSeconds": 901},
            "runtimes.0.invokeTimeoutSeconds: Input should be less than or equal to 900",
        ),
        (
            {"invokeTimeoutSeconds": float("nan")},
            "runtimes.0.invokeTimeoutSeconds: Input should be a finite number",
        ),
        (
            {"limits": {"openFiles": 1}},
            "runtimes.0.limits.openFiles: Input should be greater than or equal to 16",
        ),
        ({"limits": {"nice": 5}}, "runtimes.0.limits.nice: Extra inputs are not permitted"),
        ({"replicas": 2}, "runtimes.0.replicas: Extra inputs are not permitted"),
    ],
)
def test_runtime_errors_name_the_field(changes, expected):
    found = problems(runtime_data(**changes))
    assert any(p.startswith(expected) for p in found), found


def test_min_hosts_equal_to_max_hosts_is_allowed():
    (rt,) = parse_config(runtime_data(minHosts=3, maxHosts=3)).runtimes
    assert (rt.minHosts, rt.maxHosts) == (3, 3)


def test_a_runtime_needs_a_name_and_an_adapter():
    found = problems({"runtimes": [{}]})
    assert "runtimes.0.name: Field required" in found
    assert "runtimes.0.adapter: Field required" in found


def test_runtime_names_must_be_unique():
    data = {"runtimes": [{"name": "python", "adapter": "python"}, {"name": "python", "adapter": "bash"}]}
    assert problems(data) == ("runtimes: runtime names must be unique; 'python' appears more than once",)


def test_an_empty_runtime_list_is_refused():
    assert problems({"runtimes": []})[0].startswith("runtimes: List should have at least 1 item")


def test_tenant_names_must_be_unique():
    data = {"tenants": [{"name": "tenant-a"}, {"name": "tenant-a", "mode": "Hybrid"}]}
    assert problems(data) == ("tenants: tenant names must be unique; 'tenant-a' appears more than once",)


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [
        (
            {"name": "tenant-a", "mode": "Dedicated", "allowSharedFallback": True},
            "tenants.0.allowSharedFallback: a Dedicated tenant never falls back to shared capacity",
        ),
        (
            {"name": "tenant-a", "mode": "Exclusive"},
            "tenants.0.mode: Input should be 'Shared', 'Dedicated' or 'Hybrid'",
        ),
        ({"name": "Tenant A"}, "tenants.0.name: a DNS-1123 label"),
        (
            {"name": "tenant-a", "maxHosts": -1},
            "tenants.0.maxHosts: Input should be greater than or equal to 0",
        ),
        (
            {"name": "tenant-a", "allowSharedFallback": "yes"},
            "tenants.0.allowSharedFallback: Input should be a valid boolean",
        ),
        ({"name": "tenant-a", "group": "Big Co"}, "tenants.0.group: a DNS-1123 label"),
    ],
)
def test_tenant_errors_name_the_field(tenant, expected):
    found = problems({"tenants": [tenant]})
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"queueLimit": -1}, "queueLimit: Input should be greater than or equal to 0"),
        ({"queueLimit": "5"}, "queueLimit: Input should be a valid integer"),
        ({"heartbeatIntervalSeconds": 0}, "heartbeatIntervalSeconds: Input should be greater than 0"),
        ({"heartbeatIntervalSeconds": True}, "heartbeatIntervalSeconds: Input should be a valid number"),
        ({"hosts": []}, "hosts: Extra inputs are not permitted"),
    ],
)
def test_platform_errors_name_the_field(changes, expected):
    found = problems(changes)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_reported_at_once():
    found = problems({"queueLimit": -1, "runtimes": [{"name": "python", "adapter": "ruby", "runs": 0}]})
    assert len(found) == 3


def test_a_queue_limit_of_zero_is_allowed():
    assert parse_config({"queueLimit": 0}).queueLimit == 0


def test_the_platform_config_round_trips_through_the_pydantic_data_converter():
    config = parse_config(
        {
            "runtimes": [{"name": "py", "adapter": "python", "limits": {"cpuSeconds": 60}}],
            "tenants": [{"name": "tenant-b", "mode": "Hybrid", "allowSharedFallback": True}],
        }
    )
    converter = pydantic_data_converter.payload_converter
    for model in (config, config.runtimes[0], config.tenants[0]):
        (back,) = converter.from_payloads(converter.to_payloads([model]), [type(model)])
        assert back == model


def test_shared_directories_and_source_roots_are_absolute_paths_without_dot_parts():
    config = parse_config({"sharedDirectories": ["/srv/data"], "allowedSourceRoots": ["/srv/functions"]})
    assert (config.sharedDirectories, config.allowedSourceRoots) == (["/srv/data"], ["/srv/functions"])
    assert parse_config({}).sharedDirectories == []
    for bad in ["relative/dir", "/srv/../etc", "/srv/./data", "/srv/\x00"]:
        for key in ("sharedDirectories", "allowedSourceRoots"):
            with pytest.raises(PlatformConfigError, match=key):
                parse_config({key: [bad]})
