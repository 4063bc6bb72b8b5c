"""Tensorlake compatibility: the import surface, signatures, enums, models and exceptions.

Each test is written from Tensorlake's public documentation or code (the comment under
its name quotes the usage); these need no daemon.
"""

from __future__ import annotations

import inspect
from datetime import datetime

import pytest

import sandfork
from sandfork import models

# tensorlake.sandbox.__all__ at 0.5.113 (71 names).
TENSORLAKE_ALL = """
SandboxClient AsyncSandboxClient Sandbox AsyncSandbox Pty AsyncPty Desktop SandboxStatus SandboxInfo
SandboxPortAccess CreateSandboxResponse CopiedSandboxResponse CopySandboxResponse SandboxPoolInfo PoolContainerInfo
CreateSandboxPoolResponse ContainerResourcesInfo GPUResources GpuModel GpuRequest CLEAR_NETWORK_POLICY
ClearNetworkPolicy NetworkConfig ArchivedSandboxInfo ListArchivedSandboxesResponse sandbox_url_from_ingress_endpoint
FileSystem FileSystemMount create_file_system list_file_systems delete_file_system SnapshotStatus SnapshotType
SnapshotWaitCondition SnapshotInfo CheckpointType CreateSnapshotResponse CommandResult ProcessStatus RestartPolicy
RestartPolicyConfig ProcessHealthCheckType ProcessHealthCheck ManagedProcessStatus ManagedProcessHealthStatus
ManagedProcessExit ManagedProcessInfo ProcessInfo SandboxLogLevel SandboxLogSignal SandboxLogsResponse
SandboxProcessLogFilter SandboxProcessLogFiltersResponse StdinMode OutputMode ProcessUser ProcessUserSpec
SendSignalResponse OutputResponse OutputEvent DirectoryEntry ListDirectoryResponse DaemonInfo HealthResponse
SandboxException SandboxError SandboxConnectionError SandboxNotFoundError PoolNotFoundError PoolInUseError RemoteAPIError
""".split()


def _params(fn: object) -> list:
    return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]


def _prefix(fn: object, names: list) -> None:
    got = [p[0] for p in _params(fn)][: len(names)]
    assert got == names, f"{getattr(fn, '__qualname__', fn)}: {got} != {names}"


def test_every_tensorlake_name_imports_from_sandfork() -> None:
    # from tensorlake.sandbox import Sandbox, SandboxClient, ...  (tensorlake/sandbox/__init__.py __all__)
    assert len(TENSORLAKE_ALL) == 71
    missing = [n for n in TENSORLAKE_ALL if not hasattr(sandfork, n)]
    assert missing == []
    namespace: dict = {}
    exec("from sandfork import " + ", ".join(TENSORLAKE_ALL), namespace)  # noqa: S102 - the import line users write
    assert set(TENSORLAKE_ALL) <= set(sandfork.__all__)


def test_models_module_paths() -> None:
    # from tensorlake.sandbox.models import SnapshotType   (docs: sandboxes/snapshots)
    from sandfork.exceptions import RemoteAPIError, SandboxNotFoundError  # noqa: F401
    from sandfork.models import ContainerState, SnapshotType, snapshot_satisfies_wait_condition

    assert SnapshotType.MEMORY.value == "memory" and ContainerState.IDLE.value == "Idle"
    assert snapshot_satisfies_wait_condition("completed", "local_ready") and not snapshot_satisfies_wait_condition("local_ready", "completed")


def test_enum_members_and_values() -> None:
    # str-Enums with lowercase values: stdin_mode="pipe", wait_until="completed", levels=["info"]
    assert [m.value for m in sandfork.SnapshotStatus] == ["in_progress", "local_ready", "completed", "failed"]
    assert {"pending", "running", "snapshotting", "suspending", "suspended", "terminated", "timeout"} <= {m.value for m in sandfork.SandboxStatus}
    assert [m.value for m in sandfork.ProcessStatus] == ["running", "exited", "signaled", "oom_killed"]
    assert [m.value for m in sandfork.StdinMode] == ["closed", "pipe"] and [m.value for m in sandfork.OutputMode] == ["capture", "discard"]
    assert [m.value for m in sandfork.RestartPolicy] == ["never", "on_failure", "always"]
    assert [m.value for m in sandfork.ProcessHealthCheckType] == ["http", "tcp"]
    assert [m.value for m in sandfork.ManagedProcessStatus] == ["starting", "running", "backing_off", "stopped"]
    assert [m.value for m in sandfork.ManagedProcessHealthStatus] == ["disabled", "starting", "healthy", "unhealthy"]
    assert [m.value for m in sandfork.GpuModel] == ["A100-40GB", "A100-80GB", "H100", "T4", "A6000", "A10"]
    assert [m.value for m in sandfork.SandboxLogLevel] == ["trace", "debug", "info", "warn", "error", "fatal"]
    assert sandfork.CheckpointType("memory") is sandfork.CheckpointType.MEMORY and sandfork.SnapshotWaitCondition("completed").value == "completed"
    assert sandfork.CLEAR_NETWORK_POLICY is sandfork.ClearNetworkPolicy.TOKEN
    assert sandfork.SandboxStatus.RUNNING == "running", "plain strings compare equal"
    # The daemon's own state names map onto Tensorlake's.
    assert sandfork.SandboxStatus("creating") is sandfork.SandboxStatus.PENDING
    assert sandfork.SandboxStatus("checkpointing") is sandfork.SandboxStatus.SNAPSHOTTING


def test_exception_hierarchy() -> None:
    # except SandboxNotFoundError / RemoteAPIError as e: e.status_code  (tensorlake/sandbox/exceptions.py)
    for cls in (sandfork.SandboxConnectionError, sandfork.SandboxNotFoundError, sandfork.PoolNotFoundError, sandfork.PoolInUseError, sandfork.RemoteAPIError):
        assert issubclass(cls, sandfork.SandboxError) and issubclass(cls, sandfork.SandboxException)
    assert issubclass(sandfork.SandboxError, sandfork.SandboxException)
    e = sandfork.RemoteAPIError(409, "name taken")
    assert (e.status_code, e.message) == (409, "name taken")
    nf = sandfork.SandboxNotFoundError("sb-1")
    assert nf.sandbox_id == "sb-1" and "sb-1" in str(nf)
    assert sandfork.PoolNotFoundError("p").pool_id == "p"
    # sandfork's richer classes fit inside.
    assert issubclass(sandfork.SandboxNotFoundAPIError, sandfork.SandboxNotFoundError) and issubclass(sandfork.SandboxNotFoundAPIError, sandfork.RemoteAPIError)
    assert issubclass(sandfork.ConnectionError, sandfork.SandboxConnectionError) and issubclass(sandfork.ConnectionError, ConnectionError)
    assert issubclass(sandfork.BadRequestError, sandfork.RemoteAPIError) and issubclass(sandfork.BadRequestError, sandfork.InvalidArgumentError)
    assert issubclass(sandfork.FeatureNotSupportedError, NotImplementedError) and issubclass(sandfork.FeatureNotSupportedError, sandfork.SandboxError)
    assert sandfork.SandforkError is sandfork.SandboxError


def test_create_signature_matches() -> None:
    # Sandbox.create("tensorlake/ubuntu-minimal") sets the image: every parameter is positional, in this order
    names = ["image", "cpus", "memory_mb", "disk_mb", "gpus", "gpu_model", "timeout_secs", "entrypoint", "allow_internet_access",
             "allow_out", "deny_out", "pool_id", "snapshot_id", "proxy_url", "request_timeout", "startup_timeout", "name",
             "file_systems", "api_key", "api_url", "organization_id", "project_id", "namespace", "gpu"]  # fmt: skip
    _prefix(sandfork.Sandbox.create, names)
    params = {p[0]: p for p in _params(sandfork.Sandbox.create)}
    assert (params["cpus"][1], params["memory_mb"][1], params["allow_internet_access"][1]) == (1.0, 512, True)
    assert all(params[n][2] == inspect.Parameter.POSITIONAL_OR_KEYWORD for n in names)
    assert all(p[2] == inspect.Parameter.KEYWORD_ONLY for p in _params(sandfork.Sandbox.create)[len(names):]), "sandfork's extras are keyword-only"


def test_method_signatures_match() -> None:
    # sandbox.run("python", ["-c", "print('hello')"]) ; sandbox.start_process("python", args=[...], user="root", name="dev-server", ...)
    S = sandfork.Sandbox
    _prefix(S.run, ["command", "args", "env", "working_dir", "timeout", "user"])
    _prefix(S.start_process, ["command", "args", "env", "working_dir", "stdin_mode", "stdout_mode", "stderr_mode", "user", "name", "restart", "health_check"])
    _prefix(S.checkpoint, ["wait", "timeout", "poll_interval", "checkpoint_type", "wait_until"])
    _prefix(S.suspend, ["wait", "timeout", "poll_interval"])
    _prefix(S.resume, ["wait", "timeout", "poll_interval"])
    _prefix(S.update, ["name", "allow_unauthenticated_access", "exposed_ports", "network"])
    _prefix(S.write_file, ["path", "content"])
    _prefix(S.upload_file, ["local_path", "path"])
    _prefix(S.send_signal, ["process", "signal", "pid"])
    _prefix(S.write_stdin, ["process", "data", "pid"])
    _prefix(S.connect, ["sandbox_id", "proxy_url", "routing_hint", "api_key", "api_url", "organization_id", "project_id", "namespace", "request_timeout"])
    _prefix(S.list, ["api_key", "api_url", "organization_id", "project_id", "namespace", "request_timeout"])
    for name in ("get_process", "kill_process", "restart_process", "close_stdin", "get_stdout", "get_stderr", "get_output", "follow_stdout", "follow_stderr", "follow_output"):
        _prefix(getattr(S, name), ["process", "pid"])
    ck = {p[0]: p[1] for p in _params(S.checkpoint)}
    assert (ck["wait"], ck["timeout"], ck["poll_interval"], ck["checkpoint_type"], ck["wait_until"]) == (True, 300, 1.0, None, sandfork.SnapshotWaitCondition.LOCAL_READY)
    sp = {p[0]: p[1] for p in _params(S.start_process)}
    assert (sp["stdin_mode"], sp["stdout_mode"], sp["stderr_mode"]) == (sandfork.StdinMode.CLOSED, sandfork.OutputMode.CAPTURE, sandfork.OutputMode.CAPTURE)
    C = sandfork.SandboxClient
    _prefix(C.__init__, ["api_url", "api_key", "organization_id", "project_id", "namespace", "max_retries", "retry_backoff_sec", "request_timeout"])
    _prefix(C.snapshot_and_wait, ["sandbox_id", "timeout", "poll_interval", "snapshot_type", "wait_until"])
    _prefix(C.update_sandbox, ["sandbox_id", "name", "allow_unauthenticated_access", "exposed_ports", "network"])


def test_async_sandbox_has_every_sync_call() -> None:
    # AsyncSandbox mirrors Sandbox: every method except a few is `async def` with identical parameters (docs: sandboxes/async)
    sync_calls = {n for n, v in vars(sandfork.Sandbox).items() if not n.startswith("_") and (callable(v) or isinstance(v, (classmethod, property)))}
    missing = sorted(n for n in sync_calls if not hasattr(sandfork.AsyncSandbox, n))
    assert missing == []
    for name in ("run", "start_process", "checkpoint", "write_file", "read_file", "follow_output", "suspend", "update", "info", "status", "terminate", "copy", "health"):
        assert inspect.iscoroutinefunction(getattr(sandfork.AsyncSandbox, name)), name
    assert not inspect.iscoroutinefunction(sandfork.AsyncSandbox.close) and not inspect.iscoroutinefunction(sandfork.AsyncSandbox.pty_ws_url)
    sync_client = {n for n, v in vars(sandfork.SandboxClient).items() if not n.startswith("_") and callable(v)}
    assert sorted(n for n in sync_client if not hasattr(sandfork.AsyncSandboxClient, n)) == []


def test_models_construct_with_tensorlake_fields() -> None:
    # NetworkConfig(allow_internet_access=False); RestartPolicyConfig(policy=RestartPolicy.ALWAYS, max_restarts=10, ...)
    assert sandfork.NetworkConfig() == sandfork.NetworkConfig(allow_internet_access=True, allow_out=[], deny_out=[])
    rp = sandfork.RestartPolicyConfig(policy=sandfork.RestartPolicy.ALWAYS, max_restarts=10, initial_backoff_ms=500, max_backoff_ms=30_000)
    assert rp.to_json() == {"policy": "always", "max_restarts": 10, "initial_backoff_ms": 500, "max_backoff_ms": 30000}
    hc = sandfork.ProcessHealthCheck(type=sandfork.ProcessHealthCheckType.HTTP, port=8080, path="/", interval_ms=1_000, failure_threshold=3)
    assert (hc.initial_delay_ms, hc.timeout_ms) == (5_000, 500)
    assert sandfork.CommandResult(exit_code=0, stdout="a", stderr="").stdout == "a"
    assert sandfork.OutputResponse(pid=1, lines=["a"], line_count=1).line_count == 1
    assert sandfork.OutputEvent(line="x", timestamp=datetime.now(), stream="stdout").data == "x"
    assert sandfork.DirectoryEntry(name="f", is_dir=False, size=3).size == 3
    assert sandfork.ListDirectoryResponse(path="/", entries=[]).entries == []
    assert sandfork.ContainerResourcesInfo(cpus=1.0, memory_mb=1024, ephemeral_disk_mb=0).memory_mb == 1024
    assert sandfork.SendSignalResponse(success=True).success
    assert sandfork.CreateSnapshotResponse(snapshot_id="s", status=sandfork.SnapshotStatus.COMPLETED).snapshot_id == "s"
    assert sandfork.ProcessUserSpec(uid=1000, gid=1000).uid == 1000
    assert sandfork.GPUResources is sandfork.GpuRequest


def test_sandbox_url_from_ingress_endpoint() -> None:
    # sandbox_url_from_ingress_endpoint(info.ingress_endpoint, info.sandbox_id, 8080) -> https://8080-<id>.<ingress-host>
    f = sandfork.sandbox_url_from_ingress_endpoint
    assert f("https://sandbox.example.com", "sb-1") == "https://sb-1.sandbox.example.com"
    assert f("https://sandbox.example.com", "sb-1", 9501) == "https://sb-1.sandbox.example.com"
    assert f("http://localhost:9443/x", "sb-1", 8080) == "http://8080-sb-1.localhost:9443"
    with pytest.raises(ValueError, match="absolute http"):
        f("ftp://x", "sb-1")


def test_unsupported_classes_raise_not_implemented() -> None:
    # from tensorlake.sandbox import Desktop   (a feature sandfork lacks; Pty is a terminal session, made by create_pty)
    for make in (lambda: sandfork.Desktop(),):
        with pytest.raises(NotImplementedError, match="not supported by sandfork"):
            make()


def test_traced_result_conventions() -> None:
    # content = sandbox.read_file(p); content.value.decode()  and  bytes(content).decode()  (docs: sandboxes/file-operations)
    content = sandfork.TracedBytes(b"hi")
    assert content.value.decode() == bytes(content).decode() == content.decode() == "hi" and content == b"hi"
    assert len(content.trace_id) == 32 and int(content.trace_id, 16) >= 0
    items = sandfork.TracedList([1, 2])
    assert items[0] == 1 and list(items) == items.value == [1, 2] and len(items.trace_id) == 32
    result = sandfork.CommandResult(exit_code=0, stdout="x", stderr="")
    assert result.value is result and len(result.trace_id) == 32


def test_client_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    # SandboxClient.for_cloud(api_key="your-api-key")  /  Sandbox.create(api_url=..., api_key=...)
    monkeypatch.setenv("SANDFORK_URL", "unix:///tmp/from-env.sock")
    assert sandfork.SandboxClient.for_cloud(api_key="your-api-key").client.endpoint.socket_path == "/tmp/from-env.sock"
    assert sandfork.SandboxClient.for_localhost().client.endpoint.socket_path == "/tmp/from-env.sock"
    explicit = sandfork.SandboxClient(api_url="http://127.0.0.1:7070", api_key="tok")
    assert (explicit.client.endpoint.port, explicit.client.token) == (7070, "tok")
    with pytest.raises(NotImplementedError, match="namespaces other than 'default'"):
        sandfork.SandboxClient(namespace="team-a")


def test_models_field_names() -> None:
    # snap.snapshot_id, snap.status, snap.base_image ...; info.resources.cpus; proc.status, proc.started_at
    fields = lambda cls: {f for f in cls.__dataclass_fields__}  # noqa: E731
    assert {"snapshot_id", "namespace", "sandbox_id", "base_image", "status", "snapshot_type", "error", "snapshot_uri",
            "snapshot_format_version", "size_bytes", "rootfs_disk_bytes", "created_at"} <= fields(sandfork.SnapshotInfo)  # fmt: skip
    assert {"sandbox_id", "namespace", "status", "image", "resources", "timeout_secs", "entrypoint", "network", "name", "created_at",
            "terminated_at", "allow_unauthenticated_access", "exposed_ports", "sandbox_url", "pool_id", "file_systems"} <= fields(sandfork.SandboxInfo)  # fmt: skip
    assert {"handle", "pid", "status", "exit_code", "signal", "stdin_writable", "command", "args", "started_at", "ended_at", "managed"} <= fields(sandfork.ProcessInfo)
    assert {"id", "name", "status", "restart_count", "restart", "health_check", "health_status", "consecutive_health_failures",
            "last_exit", "last_error", "next_restart_at"} <= fields(sandfork.ManagedProcessInfo)  # fmt: skip
    assert issubclass(sandfork.Process, sandfork.ProcessInfo) and issubclass(sandfork.Snapshot, sandfork.SnapshotInfo)
    assert models.SnapshotInfo is sandfork.SnapshotInfo
