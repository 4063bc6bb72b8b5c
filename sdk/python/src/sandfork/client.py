"""Tensorlake's lifecycle clients: :class:`SandboxClient` and :class:`AsyncSandboxClient`.

They manage sandboxes and snapshots by id (create without waiting, get, list,
update, delete, suspend, resume, snapshot, copy, connect). Both talk to the
local sandfork daemon (``SANDFORK_URL``, or an ``api_url`` that is not one of
Tensorlake's own URLs). Calls for features sandfork lacks (pools, archived
sandboxes, logs, file systems, ports) raise ``NotImplementedError``. Unlike
Tensorlake's, constructing them emits no deprecation or preview warning.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Union

from . import errors
from ._args import check_str
from ._trace import Traced, TracedList
from ._transport import Client, seg
from .aio import AsyncForkResult, AsyncSandbox, AsyncSnapshot, _call, _call_owning
from .models import (
    ClearNetworkPolicy,
    CreateSandboxPoolResponse,
    CreateSandboxResponse,
    CreateSnapshotResponse,
    FileSystemMount,
    GpuModel,
    GpuRequest,
    ListArchivedSandboxesResponse,
    ArchivedSandboxInfo,
    NetworkConfig,
    SandboxInfo,
    SandboxLogLevel,
    SandboxLogsResponse,
    SandboxPoolInfo,
    SandboxPortAccess,
    SandboxProcessLogFiltersResponse,
    SnapshotType,
    SnapshotWaitCondition,
)
from .sandbox import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MB,
    ProgressCallback,
    Sandbox,
    _no_file_systems,
    _no_proxy,
    build_create,
    check_ports,
    check_wait_until,
    client_for,
    ensure_image,
    list_sandboxes,
    update_body,
)
from .snapshot import ForkResult, Snapshot


def _no_pools() -> errors.FeatureNotSupportedError:
    return errors.not_supported("sandbox pools", "create sandboxes directly, or fork them from a snapshot")


def _no_archive() -> errors.FeatureNotSupportedError:
    return errors.not_supported("archived sandboxes", "terminated sandboxes are listed with Sandbox.list(state='terminated')")


class SandboxClient:
    """Manages sandboxes and snapshots by id (Tensorlake's ``SandboxClient``).

    ``api_url``/``api_key`` name the daemon and its token when ``api_url`` is
    not Tensorlake's; otherwise ``SANDFORK_URL``/``SANDFORK_TOKEN`` (or the
    default socket) are used. ``organization_id``, ``project_id``,
    ``max_retries`` and ``retry_backoff_sec`` are accepted and ignored;
    ``request_timeout`` is the socket timeout of ordinary requests.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = "default",
        max_retries: int = 3,
        retry_backoff_sec: float = 0.5,
        request_timeout: float = 300.0,
        _internal: bool = False,
        *,
        client: Optional[Client] = None,
    ):
        self._client = client_for(client, api_url, api_key, namespace, request_timeout)
        self.namespace = "default"
        self.organization_id = organization_id
        self.project_id = project_id
        self.max_retries = max_retries
        self.retry_backoff_sec = retry_backoff_sec
        self.request_timeout = request_timeout

    @classmethod
    def for_cloud(
        cls,
        api_key: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        api_url: str = "https://api.tensorlake.ai",
        request_timeout: float = 300.0,
    ) -> "SandboxClient":
        """A client for the local sandfork daemon (Tensorlake's cloud URL is ignored)."""
        return cls(api_url=api_url, api_key=api_key, organization_id=organization_id, project_id=project_id, request_timeout=request_timeout)

    @classmethod
    def for_localhost(cls, api_url: str = "http://localhost:8900", namespace: str = "default", request_timeout: float = 300.0) -> "SandboxClient":
        """A client for the local sandfork daemon (Tensorlake's local URL is ignored)."""
        return cls(api_url=api_url, namespace=namespace, request_timeout=request_timeout)

    @property
    def client(self) -> Client:
        """The :class:`~sandfork.Client` underneath."""
        return self._client

    def __repr__(self) -> str:
        return f"SandboxClient(url={self._client.url!r})"

    def close(self) -> None:
        """Nothing to release (the client keeps no connection open)."""

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sandboxes -------------------------------------------------------------------

    def create(
        self,
        image: Optional[str] = None,
        cpus: float = DEFAULT_CPUS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        disk_mb: Optional[int] = None,
        gpus: Optional[int] = None,
        gpu_model: Union[GpuModel, str, None] = None,
        timeout_secs: Optional[int] = None,
        entrypoint: Optional[List[str]] = None,
        allow_internet_access: bool = True,
        allow_out: Optional[List[str]] = None,
        deny_out: Optional[List[str]] = None,
        snapshot_id: Optional[str] = None,
        name: Optional[str] = None,
        file_systems: Optional[List[FileSystemMount]] = None,
        gpu: Optional[GpuRequest] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        on_timeout: Optional[str] = None,
        on_progress: Optional[ProgressCallback] = None,
    ) -> CreateSandboxResponse:
        """Asks for a sandbox and returns at once (its status may still be ``PENDING``).

        See :meth:`Sandbox.create` for the arguments.
        """
        spec = build_create(
            self._client, image, cpus, memory_mb, disk_mb, gpus, gpu_model, timeout_secs, entrypoint,
            allow_internet_access, allow_out, deny_out, None, snapshot_id, name, file_systems, gpu, env, secrets, labels,
            on_timeout,
        )  # fmt: skip
        if spec.image is not None:
            ensure_image(self._client, spec.image, on_progress)
        info = SandboxInfo.from_json(self._client.request_json("POST", "/v1/sandboxes", json_body=spec.body, unbounded=True))
        if spec.entrypoint:
            # This daemon does not start entrypoints itself: wait for the sandbox, start it.
            sb = Sandbox(info.id, client=self._client, info=info)
            sb._wait_started(info, 300.0)
            sb.start_process(spec.entrypoint[0], spec.entrypoint[1:])
            info = sb.info()
        return CreateSandboxResponse(sandbox_id=info.id, status=info.status, name=info.name, reason=info.error)

    def create_and_connect(
        self,
        image: Optional[str] = None,
        cpus: float = DEFAULT_CPUS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        disk_mb: Optional[int] = None,
        gpus: Optional[int] = None,
        gpu_model: Union[GpuModel, str, None] = None,
        timeout_secs: Optional[int] = None,
        entrypoint: Optional[List[str]] = None,
        allow_internet_access: bool = True,
        allow_out: Optional[List[str]] = None,
        deny_out: Optional[List[str]] = None,
        pool_id: Optional[str] = None,
        snapshot_id: Optional[str] = None,
        proxy_url: Optional[str] = None,
        request_timeout: Optional[float] = None,
        startup_timeout: Optional[float] = None,
        name: Optional[str] = None,
        file_systems: Optional[List[FileSystemMount]] = None,
        gpu: Optional[GpuRequest] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        on_timeout: Optional[str] = None,
        on_progress: Optional[ProgressCallback] = None,
    ) -> Sandbox:
        """Creates a sandbox, waits until it runs, and returns a handle that owns it
        (``with`` terminates it). See :meth:`Sandbox.create`."""
        return Sandbox.create(
            image, cpus, memory_mb, disk_mb, gpus, gpu_model, timeout_secs, entrypoint, allow_internet_access,
            allow_out, deny_out, pool_id, snapshot_id, proxy_url, request_timeout or startup_timeout, None, name,
            file_systems, gpu=gpu, env=env, secrets=secrets, labels=labels, on_timeout=on_timeout, client=self._client,
            on_progress=on_progress,
        )  # fmt: skip

    def connect(
        self,
        identifier: Optional[str] = None,
        *,
        proxy_url: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        routing_hint: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> Sandbox:
        """A handle on an existing sandbox, by id or name (it does not own the sandbox)."""
        if proxy_url is not None:
            raise _no_proxy()
        return Sandbox.connect(identifier=identifier, sandbox_id=sandbox_id, client=self._client)

    def get(self, sandbox_id: str) -> SandboxInfo:
        """The sandbox's description.

        Raises:
            SandboxNotFoundError: No sandbox has that id or name.
        """
        check_str("sandbox_id", sandbox_id, none_ok=False)
        info = SandboxInfo.from_json(self._client.request_json("GET", f"/v1/sandboxes/{seg(sandbox_id)}"))
        return info

    def list(self) -> TracedList[SandboxInfo]:
        """Every live sandbox."""
        return list_sandboxes(self._client)

    def update_sandbox(
        self,
        sandbox_id: str,
        name: Optional[str] = None,
        *,
        allow_unauthenticated_access: Optional[bool] = None,
        exposed_ports: Optional[List[int]] = None,
        network: Union[NetworkConfig, ClearNetworkPolicy, None] = None,
    ) -> SandboxInfo:
        """Renames a sandbox and/or replaces its egress rules (see :meth:`Sandbox.update`)."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        update_body(name, allow_unauthenticated_access, exposed_ports, network)
        return Sandbox(sandbox_id, client=self._client).update(name, allow_unauthenticated_access=allow_unauthenticated_access, exposed_ports=exposed_ports, network=network)

    def delete(self, sandbox_id: str) -> Traced[None]:
        """Terminates a sandbox (idempotent)."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        Sandbox(sandbox_id, client=self._client).terminate()
        return Traced(None, None)

    def suspend(self, sandbox_id: str, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> Traced[None]:
        """Suspends a named sandbox (see :meth:`Sandbox.suspend`)."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        Sandbox(sandbox_id, client=self._client).suspend(wait, timeout, poll_interval)
        return Traced(None, None)

    def resume(self, sandbox_id: str, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> Traced[None]:
        """Resumes a suspended sandbox."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        Sandbox(sandbox_id, client=self._client).resume(wait, timeout, poll_interval)
        return Traced(None, None)

    def copy(self, sandbox_id: str, *, times: int = 1, request_timeout: Optional[float] = None) -> ForkResult:
        """``times`` live copies of a sandbox (see :meth:`Sandbox.copy`)."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        return Sandbox(sandbox_id, client=self._client).copy(times=times, request_timeout=request_timeout)

    # --- snapshots ---------------------------------------------------------------------

    def snapshot(self, sandbox_id: str, snapshot_type: Union[SnapshotType, str, None] = None) -> CreateSnapshotResponse:
        """Checkpoints a sandbox; the snapshot is complete when this returns."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        snap = Sandbox(sandbox_id, client=self._client).checkpoint(checkpoint_type=snapshot_type)
        assert snap is not None
        return CreateSnapshotResponse(snapshot_id=snap.snapshot_id, status=snap.status)

    def snapshot_and_wait(
        self,
        sandbox_id: str,
        timeout: float = 300,
        poll_interval: float = 1.0,
        snapshot_type: Union[SnapshotType, str, None] = None,
        wait_until: Union[SnapshotWaitCondition, str] = SnapshotWaitCondition.LOCAL_READY,
    ) -> Snapshot:
        """Checkpoints a sandbox and returns the snapshot."""
        check_str("sandbox_id", sandbox_id, none_ok=False)
        check_wait_until(wait_until)
        snap = Sandbox(sandbox_id, client=self._client).checkpoint(True, timeout, poll_interval, snapshot_type, wait_until)
        assert snap is not None
        return snap

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """A snapshot by id (``RemoteAPIError`` 404 when unknown)."""
        check_str("snapshot_id", snapshot_id, none_ok=False)
        return Snapshot.get(snapshot_id, client=self._client)

    def list_snapshots(self) -> TracedList[Snapshot]:
        """Every snapshot."""
        return TracedList(Snapshot.list(client=self._client))

    def delete_snapshot(self, snapshot_id: str) -> Traced[None]:
        """Deletes a snapshot; sandboxes restored from it keep working."""
        check_str("snapshot_id", snapshot_id, none_ok=False)
        Snapshot.delete_by_id(snapshot_id, client=self._client)
        return Traced(None, None)

    # --- Tensorlake features sandfork does not have ------------------------------------

    def claim(self, pool_id: str, *, file_systems: Optional[List[FileSystemMount]] = None) -> CreateSandboxResponse:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def create_pool(
        self,
        image: Optional[str] = None,
        cpus: float = 1.0,
        memory_mb: int = 1024,
        ephemeral_disk_mb: int = 1024,
        timeout_secs: int = 0,
        entrypoint: Optional[List[str]] = None,
        max_containers: Optional[int] = None,
        warm_containers: Optional[int] = None,
        network: Union[NetworkConfig, ClearNetworkPolicy, None] = None,
    ) -> CreateSandboxPoolResponse:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def get_pool(self, pool_id: str) -> SandboxPoolInfo:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def list_pools(self) -> List[SandboxPoolInfo]:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def update_pool(
        self,
        pool_id: str,
        image: str,
        cpus: float = 1.0,
        memory_mb: int = 1024,
        ephemeral_disk_mb: int = 1024,
        timeout_secs: int = 0,
        entrypoint: Optional[List[str]] = None,
        max_containers: Optional[int] = None,
        warm_containers: Optional[int] = None,
        network: Union[NetworkConfig, ClearNetworkPolicy, None] = None,
    ) -> SandboxPoolInfo:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def delete_pool(self, pool_id: str) -> Traced[None]:
        """Sandbox pools are not supported: raises ``NotImplementedError``."""
        raise _no_pools()

    def list_archived(self, *, limit: Optional[int] = None, cursor: Optional[str] = None, direction: Optional[str] = None) -> ListArchivedSandboxesResponse:
        """Archived sandboxes are not supported: raises ``NotImplementedError``."""
        raise _no_archive()

    def get_archived(self, sandbox_id: str) -> ArchivedSandboxInfo:
        """Archived sandboxes are not supported: raises ``NotImplementedError``."""
        raise _no_archive()

    def get_port_access(self, sandbox_id: str) -> SandboxPortAccess:
        """How the sandbox's ports are reached through the daemon's gateway."""
        sb = Sandbox(sandbox_id, client=self._client)
        info = sb.info()
        return SandboxPortAccess(
            allow_unauthenticated_access=info.allow_unauthenticated_access,
            exposed_ports=list(info.exposed_ports) if info.exposed_ports is not None else [],
            ingress_endpoint=sb.get_host(1).split(".", 1)[1],
            sandbox_url=sb.get_url(1, signed=False).rsplit("/ports/", 1)[0] + "/ports",
        )

    def expose_ports(self, sandbox_id: str, ports: List[int], *, allow_unauthenticated_access: Optional[bool] = None) -> SandboxInfo:
        """Adds ``ports`` to those the gateway serves (a sandbox that exposed no list
        served any port: it now serves these only)."""
        sb = Sandbox(sandbox_id, client=self._client)
        now = sb.info().exposed_ports or []
        return sb.update(exposed_ports=sorted(set(now) | set(check_ports(ports) or [])), allow_unauthenticated_access=allow_unauthenticated_access)

    def unexpose_ports(self, sandbox_id: str, ports: List[int]) -> SandboxInfo:
        """Removes ``ports`` from those the gateway serves."""
        sb = Sandbox(sandbox_id, client=self._client)
        now = sb.info().exposed_ports or []
        return sb.update(exposed_ports=sorted(set(now) - set(check_ports(ports) or [])))

    def get_logs(
        self,
        sandbox_id: str,
        *,
        levels: Optional[List[Union[SandboxLogLevel, str]]] = None,
        process_ids: Optional[List[str]] = None,
        next_token: Optional[str] = None,
        head: Optional[int] = None,
        tail: Optional[int] = None,
        body: Optional[str] = None,
    ) -> Any:
        """A page of a sandbox's log (see :meth:`Sandbox.get_logs`)."""
        return Sandbox(sandbox_id, client=self._client).get_logs(levels=levels, process_ids=process_ids, next_token=next_token, head=head, tail=tail, body=body)

    def list_log_processes(self, sandbox_id: str) -> Any:
        """The processes with lines in a sandbox's log (see :meth:`Sandbox.list_log_processes`)."""
        return Sandbox(sandbox_id, client=self._client).list_log_processes()

    def attach_file_system(self, sandbox_id: str, file_system_id: str, mount_path: str, *, read_only: bool = False, prefetch: bool = False, snapshot_id: Optional[str] = None) -> SandboxInfo:
        """File systems are not supported: raises ``NotImplementedError``."""
        raise _no_file_systems()

    def detach_file_system(self, sandbox_id: str, mount_path: str) -> SandboxInfo:
        """File systems are not supported: raises ``NotImplementedError``."""
        raise _no_file_systems()


class AsyncSandboxClient:
    """The asyncio twin of :class:`SandboxClient` (every call is a coroutine; ``connect``
    and ``create_and_connect`` give :class:`~sandfork.AsyncSandbox` handles)."""

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = "default",
        max_retries: int = 3,
        retry_backoff_sec: float = 0.5,
        request_timeout: float = 300.0,
        _internal: bool = False,
        *,
        client: Optional[Client] = None,
    ):
        self.sync = SandboxClient(api_url, api_key, organization_id, project_id, namespace, max_retries, retry_backoff_sec, request_timeout, client=client)

    @classmethod
    def for_cloud(
        cls,
        api_key: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        api_url: str = "https://api.tensorlake.ai",
        request_timeout: float = 300.0,
    ) -> "AsyncSandboxClient":
        """A client for the local sandfork daemon (Tensorlake's cloud URL is ignored)."""
        return cls(api_url=api_url, api_key=api_key, organization_id=organization_id, project_id=project_id, request_timeout=request_timeout)

    @classmethod
    def for_localhost(cls, api_url: str = "http://localhost:8900", namespace: str = "default", request_timeout: float = 300.0) -> "AsyncSandboxClient":
        """A client for the local sandfork daemon (Tensorlake's local URL is ignored)."""
        return cls(api_url=api_url, namespace=namespace, request_timeout=request_timeout)

    @property
    def client(self) -> Client:
        """The :class:`~sandfork.Client` underneath."""
        return self.sync.client

    def __repr__(self) -> str:
        return f"AsyncSandboxClient(url={self.client.url!r})"

    async def close(self) -> None:
        """Nothing to release."""

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def create(self, *args: Any, **kwargs: Any) -> CreateSandboxResponse:
        """See :meth:`SandboxClient.create`."""
        return await _call(self.sync.create, *args, **kwargs)

    async def create_and_connect(self, *args: Any, **kwargs: Any) -> AsyncSandbox:
        """See :meth:`SandboxClient.create_and_connect`; the handle owns the sandbox."""
        return AsyncSandbox(await _call_owning(self.sync.create_and_connect, Sandbox.terminate, *args, **kwargs))

    async def connect(self, identifier: Optional[str] = None, *, proxy_url: Optional[str] = None, sandbox_id: Optional[str] = None, routing_hint: Optional[str] = None, request_timeout: Optional[float] = None) -> AsyncSandbox:
        """See :meth:`SandboxClient.connect`."""
        return AsyncSandbox(await _call(self.sync.connect, identifier, proxy_url=proxy_url, sandbox_id=sandbox_id, routing_hint=routing_hint, request_timeout=request_timeout))

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await _call(self.sync.get, sandbox_id)

    async def list(self) -> TracedList[SandboxInfo]:
        return await _call(self.sync.list)

    async def update_sandbox(self, sandbox_id: str, name: Optional[str] = None, *, allow_unauthenticated_access: Optional[bool] = None, exposed_ports: Optional[List[int]] = None, network: Union[NetworkConfig, ClearNetworkPolicy, None] = None) -> SandboxInfo:
        return await _call(self.sync.update_sandbox, sandbox_id, name, allow_unauthenticated_access=allow_unauthenticated_access, exposed_ports=exposed_ports, network=network)

    async def delete(self, sandbox_id: str) -> Traced[None]:
        return await _call(self.sync.delete, sandbox_id)

    async def suspend(self, sandbox_id: str, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> Traced[None]:
        return await _call(self.sync.suspend, sandbox_id, wait, timeout, poll_interval)

    async def resume(self, sandbox_id: str, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> Traced[None]:
        return await _call(self.sync.resume, sandbox_id, wait, timeout, poll_interval)

    async def copy(self, sandbox_id: str, *, times: int = 1, request_timeout: Optional[float] = None) -> AsyncForkResult:
        return AsyncForkResult(await _call_owning(self.sync.copy, ForkResult.terminate_all, sandbox_id, times=times, request_timeout=request_timeout))

    async def snapshot(self, sandbox_id: str, snapshot_type: Union[SnapshotType, str, None] = None) -> CreateSnapshotResponse:
        return await _call(self.sync.snapshot, sandbox_id, snapshot_type)

    async def snapshot_and_wait(self, sandbox_id: str, timeout: float = 300, poll_interval: float = 1.0, snapshot_type: Union[SnapshotType, str, None] = None, wait_until: Union[SnapshotWaitCondition, str] = SnapshotWaitCondition.LOCAL_READY) -> AsyncSnapshot:
        return AsyncSnapshot(await _call(self.sync.snapshot_and_wait, sandbox_id, timeout, poll_interval, snapshot_type, wait_until))

    async def get_snapshot(self, snapshot_id: str) -> AsyncSnapshot:
        return AsyncSnapshot(await _call(self.sync.get_snapshot, snapshot_id))

    async def list_snapshots(self) -> TracedList[AsyncSnapshot]:
        return TracedList(AsyncSnapshot(s) for s in await _call(self.sync.list_snapshots))

    async def delete_snapshot(self, snapshot_id: str) -> Traced[None]:
        return await _call(self.sync.delete_snapshot, snapshot_id)

    async def claim(self, pool_id: str, *, file_systems: Optional[List[FileSystemMount]] = None) -> CreateSandboxResponse:
        raise _no_pools()

    async def create_pool(self, *args: Any, **kwargs: Any) -> CreateSandboxPoolResponse:
        raise _no_pools()

    async def get_pool(self, pool_id: str) -> SandboxPoolInfo:
        raise _no_pools()

    async def list_pools(self) -> List[SandboxPoolInfo]:
        raise _no_pools()

    async def update_pool(self, *args: Any, **kwargs: Any) -> SandboxPoolInfo:
        raise _no_pools()

    async def delete_pool(self, pool_id: str) -> Traced[None]:
        raise _no_pools()

    async def list_archived(self, *, limit: Optional[int] = None, cursor: Optional[str] = None, direction: Optional[str] = None) -> ListArchivedSandboxesResponse:
        raise _no_archive()

    async def get_archived(self, sandbox_id: str) -> ArchivedSandboxInfo:
        raise _no_archive()

    async def get_port_access(self, sandbox_id: str) -> SandboxPortAccess:
        return await _call(self.sync.get_port_access, sandbox_id)

    async def expose_ports(self, sandbox_id: str, ports: List[int], *, allow_unauthenticated_access: Optional[bool] = None) -> SandboxInfo:
        return await _call(self.sync.expose_ports, sandbox_id, ports, allow_unauthenticated_access=allow_unauthenticated_access)

    async def unexpose_ports(self, sandbox_id: str, ports: List[int]) -> SandboxInfo:
        return await _call(self.sync.unexpose_ports, sandbox_id, ports)

    async def get_logs(self, sandbox_id: str, **kwargs: Any) -> Any:
        return await _call(self.sync.get_logs, sandbox_id, **kwargs)

    async def list_log_processes(self, sandbox_id: str) -> Any:
        return await _call(self.sync.list_log_processes, sandbox_id)

    async def attach_file_system(self, sandbox_id: str, file_system_id: str, mount_path: str, **kwargs: Any) -> SandboxInfo:
        raise _no_file_systems()

    async def detach_file_system(self, sandbox_id: str, mount_path: str) -> SandboxInfo:
        raise _no_file_systems()


__all__ = ["AsyncSandboxClient", "SandboxClient"]
