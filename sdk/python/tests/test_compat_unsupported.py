"""Tensorlake features sandfork does not have: each call exists and raises a clear
``NotImplementedError`` naming the feature (never a silent no-op).

Each test is written the way Tensorlake's documentation uses the call (the comment under
its name quotes it); only the import line differs.
"""

from __future__ import annotations

import asyncio

import pytest

from sandfork import (
    CLEAR_NETWORK_POLICY,
    AsyncSandbox,
    FileSystemMount,
    GpuModel,
    GpuRequest,
    NetworkConfig,
    Sandbox,
    SandboxClient,
    SandboxError,
)

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def sandbox(daemon):
    with Sandbox.create(memory_mb=128) as sb:
        yield sb


def _refused(call, feature: str) -> None:
    with pytest.raises(NotImplementedError, match=feature) as info:
        call()
    assert isinstance(info.value, SandboxError) and "not supported by sandfork" in str(info.value)


def test_desktop(sandbox: Sandbox) -> None:
    # with sandbox.connect_desktop(port=5901) as desktop: desktop.screenshot()
    _refused(lambda: sandbox.connect_desktop(port=5901), r"remote desktop \(VNC\) is")


def test_file_systems(sandbox: Sandbox) -> None:
    # sandbox.attach_file_system("file_system_abc", "/mnt/skills", read_only=True); Sandbox.create(file_systems=[FileSystemMount(...)])
    # Volumes are mounted at create (tests/images/test_volumes.py); not onto a running sandbox.
    _refused(lambda: sandbox.attach_file_system("file_system_abc", "/mnt/skills", read_only=True), "file systems attached to a running sandbox are")
    _refused(lambda: sandbox.detach_file_system("/mnt/skills"), "file systems attached to a running sandbox are")
    _refused(sandbox.list_file_systems, "file systems attached to a running sandbox are")


def test_port_url_from_an_info(sandbox: Sandbox) -> None:
    # info.url_for_port(8080)   (the rest of port exposure works: test_ports.py)
    _refused(lambda: sandbox.info().url_for_port(8080), "port URLs from a SandboxInfo are")


def test_pools(daemon) -> None:
    # pool = client.create_pool(image=..., warm_containers=3, network=NetworkConfig(allow_internet_access=False)); client.claim(pool.pool_id)
    client = SandboxClient.for_cloud()
    _refused(lambda: client.create_pool(image="busybox", warm_containers=3, network=NetworkConfig(allow_internet_access=False)), "sandbox pools are")
    _refused(lambda: client.claim("pool-1"), "sandbox pools are")
    for call in (client.list_pools, lambda: client.get_pool("pool-1"), lambda: client.delete_pool("pool-1"), lambda: client.update_pool("pool-1", "busybox")):
        _refused(call, "sandbox pools are")
    _refused(lambda: Sandbox.create(pool_id="pool-1"), "sandbox pools are")


def test_gpus(daemon) -> None:
    # Sandbox.create(gpus=1, gpu_model=GpuModel.H100); Sandbox.create(gpu=GpuRequest(count=1, model=GpuModel.A10))
    _refused(lambda: Sandbox.create(gpus=1, gpu_model=GpuModel.H100), "GPUs are")
    _refused(lambda: Sandbox.create(gpu=GpuRequest(count=1, model=GpuModel.A10)), "GPUs are")


def test_archived_sandboxes(daemon) -> None:
    # client.list_archived(limit=10); client.get_archived(sandbox_id)
    client = SandboxClient.for_cloud()
    _refused(lambda: client.list_archived(limit=10), "archived sandboxes are")
    _refused(lambda: client.get_archived("sb-1"), "archived sandboxes are")


def test_proxy_urls_and_namespaces(daemon) -> None:
    # Sandbox.connect("my-env", proxy_url="https://sandbox.tensorlake.ai"); Sandbox.create(namespace="team")
    _refused(lambda: Sandbox.connect("my-env", proxy_url="https://sandbox.tensorlake.ai"), "sandbox proxy URLs are")
    _refused(lambda: Sandbox.create(namespace="team"), "namespaces other than 'default' are")


def test_update_without_fields(sandbox: Sandbox) -> None:
    # sandbox.update() with nothing to change -> SandboxError("At least one sandbox update field must be provided.")
    with pytest.raises(SandboxError, match="At least one sandbox update field must be provided."):
        sandbox.update()
    with pytest.raises(SandboxError, match="sandbox name must be a non-empty string"):
        sandbox.name = ""
    assert CLEAR_NETWORK_POLICY.value == "clear"
