"""Tensorlake compatibility against the real daemon: sandbox lifecycle, the lifecycle
client, and bad input.

Each test is written the way Tensorlake's documentation or README uses the call (the
comment under its name quotes it); only the import line differs.
"""

from __future__ import annotations

import builtins
import time
import uuid
from datetime import datetime

import pytest

from sandfork import (
    CreateSandboxResponse,
    NetworkConfig,
    RemoteAPIError,
    Sandbox,
    SandboxClient,
    SandboxConnectionError,
    SandboxError,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxStatus,
)

pytestmark = pytest.mark.daemon


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def sb(daemon):
    # sandbox = Sandbox.create()
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.terminate()


def test_create_with_defaults(sb: Sandbox) -> None:
    # sandbox = Sandbox.create()   (docs: sandboxes/snapshots)
    info = sb.info()
    assert sb.status == SandboxStatus.RUNNING
    assert (info.resources.cpus, info.resources.memory_mb) == (1.0, 512)  # the daemon's defaults (docs/api.md)
    assert info.network == NetworkConfig(allow_internet_access=True, allow_out=[], deny_out=[])
    assert isinstance(info.created_at, datetime) and info.namespace == "default"


def test_create_image_positionally(daemon) -> None:
    # Sandbox.create("tensorlake/ubuntu-minimal") sets the image (the first positional parameter)
    with Sandbox.create("busybox", 1.0, 256) as sandbox:
        info = sandbox.info()
        assert (info.image, info.resources.memory_mb) == ("busybox", 256)


def test_create_named_with_resources(daemon) -> None:
    # named = Sandbox.create(name="my-agent-env", cpus=2.0, memory_mb=2048, timeout_secs=1800)
    name = _name("my-agent-env")
    named = Sandbox.create(name=name, cpus=2.0, memory_mb=2048, timeout_secs=1800)
    try:
        assert named.sandbox_id.startswith("sb-") and named.name == name
        assert named.status == SandboxStatus.RUNNING
        info = named.info()
        assert (info.resources.cpus, info.resources.memory_mb, info.timeout_secs) == (2.0, 2048, 1800)
    finally:
        named.terminate()


def test_context_manager_terminates(daemon) -> None:
    # with client.create_and_connect(image=...) as sandbox:  ...   # terminates on exit (README)
    with Sandbox.create(memory_mb=128) as sandbox:
        sandbox_id = sandbox.sandbox_id
    assert Sandbox.connect(sandbox_id).status == SandboxStatus.TERMINATED


def test_connect_by_name_and_id(daemon) -> None:
    # sandbox = Sandbox.connect("my-env"); sandbox.suspend(); sandbox.resume(); sandbox.terminate()
    name = _name("my-env")
    with Sandbox.create(name=name, memory_mb=128) as original:
        by_name = Sandbox.connect(name)
        assert by_name.sandbox_id == original.sandbox_id, "connected by name, sandbox_id is still the id"
        assert Sandbox.connect(original.sandbox_id).name == name
        with Sandbox.connect(name):
            pass
        assert original.status == SandboxStatus.RUNNING, "a connected handle does not terminate on exit"


def test_connect_with_identifier_keyword(sb: Sandbox) -> None:
    # Sandbox.connect(identifier="...")   (skills digest; accepted as well as sandbox_id=)
    assert Sandbox.connect(identifier=sb.sandbox_id).sandbox_id == sb.sandbox_id
    assert Sandbox.connect(sandbox_id=sb.sandbox_id).sandbox_id == sb.sandbox_id


def test_connect_unknown_sandbox(daemon) -> None:
    # except SandboxNotFoundError: ...   (404 on a lifecycle call)
    with pytest.raises(SandboxNotFoundError) as info:
        Sandbox.connect("sb-0000000000000000")
    err = info.value
    assert isinstance(err, RemoteAPIError) and err.status_code == 404
    assert err.sandbox_id == "sb-0000000000000000" and "sb-0000000000000000" in str(err)


def test_list_sandboxes(sb: Sandbox) -> None:
    # for sb in Sandbox.list(): print(sb.sandbox_id, sb.status)
    listed = Sandbox.list()
    found = [s for s in listed if s.sandbox_id == sb.sandbox_id]
    assert found and found[0].status == SandboxStatus.RUNNING and isinstance(found[0], SandboxInfo)
    assert len(listed.trace_id) == 32 and listed[0] in listed


def test_status_property_is_fresh(daemon) -> None:
    # named.status   # a property, SandboxStatus enum, fetched on every access
    sandbox = Sandbox.create(memory_mb=128)
    assert sandbox.status == SandboxStatus.RUNNING == "running"
    Sandbox.connect(sandbox.sandbox_id).terminate()
    assert sandbox.status == SandboxStatus.TERMINATED


def test_info_fields(sb: Sandbox) -> None:
    # info = sandbox.info(); info.sandbox_id, info.status, info.resources, info.network ...
    info = sb.info()
    assert info.sandbox_id == sb.sandbox_id and info.status == SandboxStatus.RUNNING
    assert info.value is info and len(info.trace_id) == 32
    assert info.exposed_ports is None and info.allow_unauthenticated_access is False and info.sandbox_url is None


def test_suspend_resume_named(daemon) -> None:
    # sandbox.suspend(); sandbox.resume()   (named sandboxes)
    with Sandbox.create(name=_name("susp"), memory_mb=128) as sandbox:
        sandbox.write_file("/tmp/keep", b"kept")
        assert sandbox.suspend() is None
        assert sandbox.status == SandboxStatus.SUSPENDED
        sandbox.resume()
        assert sandbox.status == SandboxStatus.RUNNING
        assert sandbox.read_file("/tmp/keep") == b"kept"


def test_create_without_internet(daemon) -> None:
    # Sandbox.create(allow_internet_access=False)
    with Sandbox.create(allow_internet_access=False, memory_mb=128) as sandbox:
        net = sandbox.info().network
        assert net is not None and not net.allow_internet_access
        assert sandbox.run("sh", ["-c", "ip -o link | grep -v ': lo:' | wc -l"]).stdout.strip() == "0"


def test_create_with_egress_rules(daemon) -> None:
    # Sandbox.create(allow_internet_access=True, allow_out=[..., "203.0.113.10", "10.0.0.0/8"]); Sandbox.create(deny_out=[...])
    with Sandbox.create(allow_internet_access=True, allow_out=["203.0.113.10", "198.51.100.0/24"], memory_mb=128) as sandbox:
        assert sandbox.info().network == NetworkConfig(True, ["203.0.113.10", "198.51.100.0/24"], [])
    # A private range is opened only where the operator allowed it (allow_out_guarded).
    with pytest.raises(RemoteAPIError, match="allow_out_guarded"):
        Sandbox.create(allow_internet_access=True, allow_out=["203.0.113.10", "10.0.0.0/8"], memory_mb=128)
    with Sandbox.create(deny_out=["198.51.100.0/24"], memory_mb=128) as sandbox:
        assert sandbox.info().network.deny_out == ["198.51.100.0/24"]


def test_create_with_api_url(daemon) -> None:
    # Sandbox.create(api_key=..., api_url=...)   (an explicit endpoint)
    with Sandbox.create(memory_mb=128, api_url=daemon.url, api_key=daemon.token) as sandbox:
        assert sandbox.client.url == daemon.url
        assert sandbox.run("echo", ["ok"]).stdout == "ok"


def test_unknown_parameter_is_a_type_error(daemon) -> None:
    # Sandbox.create(secret_names=[...]) raises TypeError at HEAD (removed in 0.5.32)
    with pytest.raises(TypeError, match="secret_names"):
        Sandbox.create(secret_names=["OPENAI_API_KEY"])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="ephemeral_disk_mb"):
        Sandbox.create(ephemeral_disk_mb=1024)  # type: ignore[call-arg]


def test_wrong_types_raise_sandbox_error(sb: Sandbox) -> None:
    # Tensorlake wraps a failed request model as SandboxError; sandfork's is also a TypeError
    for bad in (lambda: Sandbox.create(cpus="two"), lambda: Sandbox.create(memory_mb="1GB"), lambda: Sandbox.create(allow_out="10.0.0.0/8"),
                lambda: sb.run(42), lambda: sb.run("ls", "-l"), lambda: sb.write_file("/tmp/x", 123), lambda: Sandbox.connect(42)):  # fmt: skip
        with pytest.raises(SandboxError) as info:
            bad()
        assert isinstance(info.value, TypeError)
    with pytest.raises(SandboxError, match="cpus must be a number, got str 'two'"):
        Sandbox.create(cpus="two")


def test_bad_value_is_a_remote_api_error(daemon) -> None:
    # except RemoteAPIError as e: e.status_code == 400
    with pytest.raises(RemoteAPIError) as info:
        Sandbox.create(memory_mb=8)
    assert info.value.status_code == 400 and "memory_mb" in info.value.message
    with pytest.raises(RemoteAPIError) as info:
        Sandbox.create(name="not a valid name!")
    assert info.value.status_code == 400 and "name" in info.value.message


def test_connection_failure(tmp_path) -> None:
    # except SandboxConnectionError: the daemon cannot be reached
    with pytest.raises(SandboxConnectionError) as info:
        Sandbox.connect("sb-x", api_url=f"unix://{tmp_path}/nothing.sock")
    assert isinstance(info.value, builtins.ConnectionError) and "nothing.sock" in str(info.value)


def test_trace_ids(sb: Sandbox) -> None:
    # sandbox.trace_id; result.trace_id   (Traced results)
    created = Sandbox.connect(sb.sandbox_id)
    assert created.trace_id is not None and len(created.trace_id) == 32
    r = sb.run("true")
    assert r.value is r and len(r.trace_id) == 32


# --- the lifecycle client ---------------------------------------------------------------


def test_client_create_get_delete(daemon) -> None:
    # client = SandboxClient.for_cloud(api_key=...); named = client.create(image=..., name="stable-name"); sandbox = client.connect("stable-name")
    client = SandboxClient.for_cloud(api_key="your-api-key")
    name = _name("stable-name")
    created = client.create(image="busybox", memory_mb=128, name=name)
    try:
        assert isinstance(created, CreateSandboxResponse) and created.name == name
        assert created.status in (SandboxStatus.PENDING, SandboxStatus.RUNNING)
        sandbox = client.connect(name)
        deadline = time.monotonic() + 60
        while client.get(created.sandbox_id).status != SandboxStatus.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sandbox.run("echo", ["hi"]).stdout == "hi"
        assert created.sandbox_id in [s.sandbox_id for s in client.list()]
    finally:
        client.delete(created.sandbox_id)
    assert client.get(created.sandbox_id).status == SandboxStatus.TERMINATED
    with pytest.raises(SandboxNotFoundError):
        client.get("no-such-sandbox")


def test_client_create_and_connect(daemon) -> None:
    # with client.create_and_connect(image="tensorlake/ubuntu-minimal") as sandbox: result = sandbox.run(...)
    with SandboxClient() as client:
        with client.create_and_connect(image="busybox", memory_mb=128) as sandbox:
            result = sandbox.run("sh", ["-lc", "printf 'Hello from the sandbox!\\n'"])
            assert result.stdout == "Hello from the sandbox!"
            sandbox_id = sandbox.sandbox_id
        assert client.get(sandbox_id).status == SandboxStatus.TERMINATED


def test_client_suspend_resume(daemon) -> None:
    # client.suspend(sandbox_id); client.resume(sandbox_id)
    client = SandboxClient()
    with Sandbox.create(name=_name("csusp"), memory_mb=128) as sandbox:
        client.suspend(sandbox.sandbox_id)
        assert client.get(sandbox.sandbox_id).status == SandboxStatus.SUSPENDED
        client.resume(sandbox.sandbox_id)
        assert client.get(sandbox.sandbox_id).status == SandboxStatus.RUNNING
