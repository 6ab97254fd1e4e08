"""The pod evaluator in cluster mode, end to end: `krt fn eval --pods` on a FunctionConfig whose
image has no kruntimes in it. Its Runs use a krm runtime whose host pods are of the function's
image, the host installed by an init container of the kruntimes image (`kubernetes.hostInjection`);
the test cluster's kubelet runs the init container and the host as real processes, and the host
runs the function's program from the podExecutor's entrypoint."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from kruntimes.activities.hosts import kubernetes_pods as pods
from kruntimes.krm.resources import parse_resource_list, resource_list
from kruntimes.sdk import config as clientconfig
from tests.krm import programs
from tests.krm.conftest import items
from tests.kubernetes.platform import IMAGE, kube_platform, kubernetes_runtime
from tests.support.pki import TestPKI

pytestmark = pytest.mark.timeout(300)

FN_IMAGE = "registry.example/fn/set-labels"  # an image without kruntimes
RUNTIME = "krm-set-labels"


def krm_runtime() -> dict:
    runtime = kubernetes_runtime(
        RUNTIME, hostInjection={"image": IMAGE}, podTemplate={"image": f"{FN_IMAGE}:v0.2.1"}
    )
    return {**runtime, "adapter": "krm", "maxHosts": 1}


async def test_krt_fn_eval_pods_runs_the_function_on_a_pod_of_its_own_image(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI
) -> None:
    # The function's program, where a function's uid can read it (the test's directories are
    # the test's own, and a function has a private /tmp): the function's "image" is this
    # directory on the node.
    image_root = Path(tempfile.mkdtemp(prefix="krm-fn-image-", dir="/var/tmp"))
    try:
        image_root.chmod(0o755)
        program = programs.write(image_root, "set-labels", programs.SET_LABELS)
        configs = tmp_path_factory.mktemp("fn-configs")
        (configs / "set-labels.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kruntimes.io/v1alpha1",
                    "kind": "FunctionConfig",
                    "metadata": {"name": "set-labels"},
                    "spec": {
                        "prefixes": [FN_IMAGE],
                        "podExecutor": {"tags": ["v0.2.1"], "runtime": RUNTIME, "entrypoint": [str(program)]},
                    },
                }
            )
        )
        root = tmp_path_factory.mktemp("krm-cluster")
        async with kube_platform(root, pki, runtimes=[krm_runtime()]) as platform:
            client_dir = root / "client"
            client_dir.mkdir()
            clientconfig.write(client_dir, platform.config)
            argv = [
                sys.executable,
                "-m",
                "kruntimes.workers.krt",
                "fn",
                "eval",
                "-",
                "--image",
                f"{FN_IMAGE}:v0.2.1",
            ]
            argv += ["--fn-configs", str(configs), "--pods", "--timeout", "120", "--", "team=a"]
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("KRT_")}}
            env["KRT_STATE_DIR"] = str(client_dir)
            done = await asyncio.to_thread(
                subprocess.run,
                argv,
                input=resource_list(items()),
                capture_output=True,
                env=env,
                timeout=240,
            )
            assert done.returncode == 0, done.stderr.decode()
            output = parse_resource_list(done.stdout)
            assert [item["metadata"]["labels"]["team"] for item in output["items"]] == ["a", "a"]
            assert done.stderr.startswith(f'[PASS] "{FN_IMAGE}:v0.2.1"'.encode())

            [pod] = platform.pods(RUNTIME)
            assert pod["spec"]["containers"][0]["image"] == f"{FN_IMAGE}:v0.2.1"
            assert [c["image"] for c in pod["spec"]["initContainers"]] == [IMAGE]
            assert (pod["metadata"]["name"], pods.INSTALL_CONTAINER, 0) in platform.kubelet.initialized
    finally:
        shutil.rmtree(image_root, ignore_errors=True)
