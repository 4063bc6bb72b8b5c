"""The :class:`Sandbox` handle: lifecycle, commands, processes, files, checkpoints.

Its calls have Tensorlake's names, parameters (names, order, defaults) and
result shapes; sandfork's additions (fork fan-out, fork identity, restore
hooks, export/import, streaming) are extra methods or keyword-only arguments.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import errors
from ._args import (
    UNSET,
    check_bool,
    check_bytes,
    check_enum,
    check_int,
    check_number,
    check_str,
    check_str_list,
    check_str_map,
    drop_none,
    egress_rules,
    identifier_of,
    network_fields,
    process_name,
    process_selector,
    user_string,
)
from ._files import FilesMixin
from ._streams import OutputCallback, OutputStream
from ._trace import Traced, TracedList, new_trace_id
from ._transport import Client, seg
from .pty import PtyCommands, PtySession
from .models import (
    CLEAR_NETWORK_POLICY,
    CheckpointType,
    ClearNetworkPolicy,
    CommandResult,
    DaemonInfo,
    FileSystemMount,
    GpuModel,
    GpuRequest,
    HealthResponse,
    NetworkConfig,
    OutputEvent,
    OutputMode,
    OutputResponse,
    ProcessHealthCheck,
    ProcessInfo,
    ProcessUser,
    RestartPolicyConfig,
    SandboxInfo,
    SandboxLogLevel,
    SandboxLogSignal,
    SandboxLogsResponse,
    SandboxProcessLogFilter,
    SandboxProcessLogFiltersResponse,
    SandboxStats,
    SandboxStatus,
    SendSignalResponse,
    SnapshotType,
    SnapshotWaitCondition,
    StdinMode,
)
from .events import EventStream, FileWatch, LogEntry, LogStream
from .process import Process, SignalLike, signal_value
from .snapshot import ForkResult, Snapshot, bind_sandbox_factory, fork_body

Command = Union[str, Sequence[str]]
ProgressCallback = Callable[[str], Any]
"""Called with each progress line of an image build."""

log = logging.getLogger("sandfork")

DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 512  # the daemon's own default (docs/api.md, "Defaults")
DEFAULT_STARTUP_TIMEOUT = 300.0

# Tensorlake's own endpoints: an api_url naming one of them means "the default daemon".
_TENSORLAKE_URLS = {"https://api.tensorlake.ai", "http://localhost:8900"}

_STARTING = {SandboxStatus.PENDING, SandboxStatus.RESUMING, SandboxStatus.SUSPENDING}


def client_for(
    client: Optional[Client] = None,
    api_url: Optional[str] = None,
    api_key: Optional[str] = None,
    namespace: Optional[str] = None,
    request_timeout: Optional[float] = None,
) -> Client:
    """The :class:`Client` for Tensorlake-style connection arguments.

    An explicit ``client`` wins. Otherwise ``api_url`` (with ``api_key`` as its
    bearer token) names the daemon, unless it is absent or one of Tensorlake's
    own URLs; then ``SANDFORK_URL`` / ``SANDFORK_TOKEN`` / the default socket are
    used. ``request_timeout`` becomes the socket timeout of ordinary requests.
    """
    check_namespace(namespace)
    if client is not None:
        return client
    check_str("api_url", api_url)
    check_str("api_key", api_key)
    timeout = check_number("request_timeout", request_timeout)
    if api_url is None or api_url.rstrip("/") in _TENSORLAKE_URLS:
        return Client(timeout=timeout)
    return Client(url=api_url, token=api_key, timeout=timeout)


def check_namespace(namespace: Optional[str]) -> None:
    """sandfork has one namespace, ``default``."""
    if namespace is not None and namespace != "default":
        raise errors.not_supported("namespaces other than 'default'", f"got namespace={namespace!r}", plural=True)


def exec_body(
    command: Command,
    args: Optional[Iterable[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    working_dir: Optional[str] = None,
    timeout: Optional[float] = None,
    stdin: Union[None, str, bytes] = None,
    user: Optional[ProcessUser] = None,
) -> Dict[str, Any]:
    """The API's ``Exec`` document for a command.

    ``command`` may also be a list (``["ls", "-l"]``), split into command and arguments.
    """
    if not isinstance(command, str):
        if isinstance(command, (bytes, bytearray)) or not isinstance(command, (list, tuple)):
            raise errors.ArgumentTypeError(f"command must be a string (or a list of strings), got {type(command).__name__} {command!r}")
        parts = check_str_list("command", command, none_ok=False) or []
        if not parts:
            raise errors.ArgumentValueError("the command is empty")
        command, args = parts[0], parts[1:] + list(check_str_list("args", args) or [])
    args_list = check_str_list("args", args)
    env_map = check_str_map("env", env)
    check_str("working_dir", working_dir)
    timeout = check_number("timeout", timeout)
    body = drop_none(command=command, args=args_list, env=env_map or None, working_dir=working_dir, user=user_string(user))
    if timeout is not None:
        body["timeout_secs"] = float(timeout)
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif stdin is not None:
        body["stdin_b64"] = base64.b64encode(check_bytes("stdin", stdin)).decode("ascii")
    return body


def ensure_image(client: Client, name: str, on_progress: Optional[ProgressCallback] = None) -> None:
    """Makes sure the daemon has image ``name``: builds a built-in one (busybox,
    debian, python) or joins a build in flight, reporting progress lines to
    ``on_progress`` (else to the ``sandfork`` logger at INFO)."""
    if not client.features().ensure_image or client.has_image(name):
        return
    report = on_progress or (lambda line: log.info("image %s: %s", name, line))
    with client.open("POST", f"/v1/images/{seg(name)}/ensure", unbounded=True) as stream:
        for event in stream.iter_json_lines():
            kind = event.get("type")
            if kind == "progress":
                report(str(event.get("message", "")))
            elif kind == "done":
                client._image_ready(name)
                return
            elif kind == "error":
                raise errors.error_from_event(event)
    raise errors.ConnectionError(f"the daemon ended the build stream of image {name} without a result")


class CreateSpec:
    """A create request built from Tensorlake's arguments."""

    def __init__(self, body: Dict[str, Any], entrypoint: Optional[List[str]], image: Optional[str]):
        self.body = body
        self.entrypoint = entrypoint  # to start from the SDK (daemons without `entrypoint`)
        self.image = image  # to ensure before creating


def volume_mounts(file_systems: Optional[List[FileSystemMount]]) -> List[Dict[str, Any]]:
    """Tensorlake's file system mounts as sandfork's named volumes: ``file_system_id`` is
    the volume's name (see :class:`~sandfork.volumes.Volume`)."""
    out: List[Dict[str, Any]] = []
    for fs in file_systems or []:
        if not isinstance(fs, FileSystemMount):
            raise errors.BadRequestError(f"file_systems takes FileSystemMount values, not {type(fs).__name__}")
        if fs.snapshot_id is not None:
            raise errors.not_supported("file system snapshots", "a volume is mounted as it is now")
        out.append({"name": fs.file_system_id, "path": fs.mount_path, "read_only": bool(fs.read_only)})
    return out


def build_create(
    client: Client,
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
    name: Optional[str] = None,
    file_systems: Optional[List[FileSystemMount]] = None,
    gpu: Optional[GpuRequest] = None,
    env: Optional[Mapping[str, str]] = None,
    secrets: Optional[Mapping[str, str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    on_timeout: Optional[str] = None,
    public_ports: Optional[bool] = None,
    exposed_ports: Optional[List[int]] = None,
) -> CreateSpec:
    """Checks Tensorlake's create arguments and builds the daemon's request."""
    if gpus is not None or gpu is not None or gpu_model is not None:
        raise errors.not_supported("GPUs", "sandboxes get CPU and memory only")
    if pool_id is not None:
        raise errors.not_supported("sandbox pools", "create sandboxes directly, or fork them from a snapshot")
    volumes = volume_mounts(file_systems)
    check_str("image", image)
    cpus_v = check_number("cpus", cpus, none_ok=False)
    memory_v = check_int("memory_mb", memory_mb, none_ok=False)
    disk_v = check_int("disk_mb", disk_mb)
    timeout_v = check_int("timeout_secs", timeout_secs, minimum=0)
    entry = check_str_list("entrypoint", entrypoint)
    check_str("snapshot_id", snapshot_id)
    check_str("name", name)
    net = network_fields(allow_internet_access, allow_out, deny_out)
    body: Dict[str, Any] = drop_none(
        name=name, disk_mb=disk_v, timeout_secs=timeout_v,
        env=check_str_map("env", env) or None, secrets=check_str_map("secrets", secrets) or None,
        labels=check_str_map("labels", labels) or None, volumes=volumes or None,
        on_timeout=check_on_timeout(on_timeout), public_ports=check_bool("public_ports", public_ports),
        exposed_ports=check_ports(exposed_ports),
    )  # fmt: skip
    if snapshot_id is not None:
        body["snapshot_id"] = snapshot_id
        if image is not None:
            body["image"] = image  # the daemon refuses image + snapshot_id, naming both
            memory = False
        else:
            snap = client.request_json("GET", f"/v1/snapshots/{seg(snapshot_id)}") or {}
            memory = snap.get("type") == "memory"
        if not memory or cpus_v != DEFAULT_CPUS:
            body["cpus"] = cpus_v
        if not memory or memory_v != DEFAULT_MEMORY_MB:
            body["memory_mb"] = memory_v
        # A restore keeps the snapshot's network unless other rules are asked for.
        if allow_internet_access is False or allow_out is not None or deny_out is not None:
            body.update(net)
    else:
        if image is not None:
            body["image"] = image
        body["cpus"] = cpus_v
        body["memory_mb"] = memory_v
        body.update(net)
    later = None
    if entry:
        if client.features().entrypoint:
            body["entrypoint"] = entry
        else:
            later = entry
    return CreateSpec(body, later, None if snapshot_id is not None else (image or client.features().default_image))


class Sandbox(FilesMixin):
    """An isolated Linux sandbox managed by the sandfork daemon.

    Get one with :meth:`create` (a new sandbox, or a restore of a snapshot)
    or :meth:`connect` (an existing one). A handle is just the sandbox id and
    a :class:`~sandfork.Client`; it can be used from many threads at once.

    Used as a context manager, a sandbox this code created is terminated on
    exit; one reached with :meth:`connect` is left running.

    ``Sandbox(identifier)`` (with ``client=`` or ``api_url=``) builds a handle
    directly; unlike Tensorlake's it needs no proxy URL and can do everything.
    """

    def __init__(
        self,
        identifier: Optional[str] = None,
        proxy_url: Optional[str] = None,
        api_key: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        *,
        sandbox_id: Optional[str] = None,
        routing_hint: Optional[str] = None,
        request_timeout: Optional[float] = None,
        api_url: Optional[str] = None,
        client: Optional[Client] = None,
        info: Optional[SandboxInfo] = None,
        owned: bool = False,
    ):
        if proxy_url is not None:
            raise _no_proxy()
        self.id = identifier_of(identifier, sandbox_id, "")
        self._client = client_for(client, api_url, api_key, None, request_timeout)
        self._info = info
        self._owned = owned
        self._trace_id: Optional[str] = None

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, name={self._info.name if self._info else None!r})"

    @property
    def client(self) -> Client:
        """The :class:`~sandfork.Client` this handle talks through."""
        return self._client

    @property
    def _route(self) -> str:
        return f"/v1/sandboxes/{seg(self.id)}"

    @property
    def pty(self) -> PtyCommands:
        """Terminal sessions in this sandbox: ``sandbox.pty.create()`` starts a shell on a
        pseudo-terminal (see :mod:`sandfork.pty`)."""
        return PtyCommands(self._client, self._route)

    # --- lifecycle -------------------------------------------------------

    @classmethod
    def create(
        cls,
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
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        gpu: Optional[GpuRequest] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        on_timeout: Optional[str] = None,
        client: Optional[Client] = None,
        on_progress: Optional[ProgressCallback] = None,
        public_ports: Optional[bool] = None,
        exposed_ports: Optional[List[int]] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns it once it is running.

        Args:
            image: Image name; the daemon's default image when omitted.
                A built-in image (``busybox``, ``debian``, ``python``) is built
                on first use; progress goes to ``on_progress``.
            cpus: CPU cores (default 1.0).
            memory_mb: Memory limit in MiB (default 512).
            disk_mb: Root disk size in MiB (default: the image's size).
            timeout_secs: Idle seconds (no request touching the sandbox) before
                ``on_timeout``; ``None`` or 0: never. See :meth:`set_timeout`.
            entrypoint: A command started in the background once the sandbox runs.
            allow_internet_access: Egress to the internet through the host (default True).
            allow_out: IPv4 addresses/CIDRs that are the only ones allowed out.
            deny_out: IPv4 addresses/CIDRs denied out (wins over ``allow_out``).
            public_ports: Serve the sandbox's ports through the gateway without a token
                (default: private; see :meth:`get_url`).
            exposed_ports: The only ports the gateway serves (default: any).
            snapshot_id: Start from this snapshot instead of an image (warm
                for a memory snapshot, cold boot for a filesystem one). A memory
                snapshot pins its resources: ``cpus``/``memory_mb`` are sent only
                when they differ from the defaults.
            request_timeout / startup_timeout: Seconds to wait for the sandbox
                to run (default 300).
            name: Unique name; named sandboxes can be suspended.
            api_url, api_key: The daemon's URL and token (default:
                ``SANDFORK_URL`` / ``SANDFORK_TOKEN`` / the default socket).
            organization_id, project_id: Accepted and ignored.
            namespace: Only ``"default"``.
            file_systems: Named volumes to mount: ``FileSystemMount(file_system_id=
                VOLUME_NAME, mount_path=PATH, read_only=...)`` (see ``Volume``).
            gpus, gpu_model, gpu, pool_id, proxy_url: Tensorlake features sandfork
                lacks: giving them raises ``NotImplementedError``.
            env: Environment for every command run in the sandbox (sandfork).
            secrets: Like ``env``, never echoed back by the API (sandfork).
            labels: Free-form key/value labels (sandfork).
            client: The daemon to use (sandfork).
            on_progress: Called with each progress line of an image build (sandfork).

        Raises:
            CapacityError: Admission refused the sandbox.
            BadRequestError, UnsupportedError: Bad or unsupported options.
            SandboxError: The sandbox failed to start, or did not start in time.
        """
        if proxy_url is not None:
            raise _no_proxy()
        client = client_for(client, api_url, api_key, namespace, request_timeout)
        budget = check_number("startup_timeout", startup_timeout) or check_number("request_timeout", request_timeout) or DEFAULT_STARTUP_TIMEOUT
        spec = build_create(
            client, image, cpus, memory_mb, disk_mb, gpus, gpu_model, timeout_secs, entrypoint, allow_internet_access,
            allow_out, deny_out, pool_id, snapshot_id, name, file_systems, gpu, env, secrets, labels, on_timeout,
            public_ports, exposed_ports,
        )  # fmt: skip
        if spec.image is not None:
            ensure_image(client, spec.image, on_progress)
        trace_id = new_trace_id()
        doc = client.request_json("POST", "/v1/sandboxes", json_body=spec.body, timeout=max(budget, 60.0))
        info = SandboxInfo.from_json(doc)
        sandbox = cls(info.id, client=client, info=info, owned=True)
        sandbox._trace_id = trace_id
        try:
            sandbox._wait_started(info, budget)
            if spec.entrypoint:
                sandbox.start_process(spec.entrypoint[0], spec.entrypoint[1:], stdin_mode=StdinMode.CLOSED)
        except BaseException:
            sandbox._terminate_quietly()
            raise
        return sandbox

    @classmethod
    def connect(
        cls,
        sandbox_id: Optional[str] = None,
        *,
        proxy_url: Optional[str] = None,
        routing_hint: Optional[str] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        request_timeout: Optional[float] = None,
        identifier: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Attaches to an existing sandbox by id or name (``identifier=`` works too).

        The handle does not own the sandbox: leaving ``with`` does not terminate
        it (``terminate()`` still does).

        Raises:
            SandboxNotFoundError: No sandbox has that id or name (also a
                ``RemoteAPIError`` with status 404).
        """
        if proxy_url is not None:
            raise _no_proxy()
        target = identifier_of(sandbox_id, identifier, "")
        client = client_for(client, api_url, api_key, namespace, request_timeout)
        info = SandboxInfo.from_json(client.request_json("GET", f"/v1/sandboxes/{seg(target)}"))
        sandbox = cls(info.id, client=client, info=info, owned=False)
        sandbox._trace_id = new_trace_id()
        return sandbox

    @classmethod
    def list(
        cls,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        request_timeout: float = 300.0,
        *,
        state: Union[None, str, SandboxStatus] = None,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
    ) -> TracedList[SandboxInfo]:
        """Lists sandboxes (terminated ones only with ``state="terminated"``);
        sandfork's ``state``, ``name`` and ``labels`` (every one given must match) filter
        the list."""
        client = client_for(client, api_url, api_key, namespace, request_timeout)
        return list_sandboxes(client, state, name, labels)

    @classmethod
    def get_snapshot(
        cls,
        snapshot_id: str,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        request_timeout: float = 300.0,
        *,
        client: Optional[Client] = None,
    ) -> Snapshot:
        """Looks a snapshot up by id.

        Raises:
            RemoteAPIError: Status 404 when no snapshot has that id.
        """
        check_str("snapshot_id", snapshot_id, none_ok=False)
        return Snapshot.get(snapshot_id, client=client_for(client, api_url, api_key, namespace, request_timeout))

    @classmethod
    def delete_snapshot(
        cls,
        snapshot_id: str,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        request_timeout: float = 300.0,
        *,
        client: Optional[Client] = None,
    ) -> None:
        """Deletes a snapshot by id; sandboxes restored from it keep working."""
        check_str("snapshot_id", snapshot_id, none_ok=False)
        Snapshot.delete_by_id(snapshot_id, client=client_for(client, api_url, api_key, namespace, request_timeout))

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (also :attr:`id`), even when connected by name."""
        return self.id

    @property
    def trace_id(self) -> Optional[str]:
        """A trace id for the create or connect call of this handle."""
        return self._trace_id

    @property
    def name(self) -> Optional[str]:
        """The sandbox's name, or ``None`` when unnamed (as of the last answer from the daemon)."""
        return self._cached_info().name

    @name.setter
    def name(self, value: str) -> None:
        if not value or not isinstance(value, str):
            raise errors.SandboxError("sandbox name must be a non-empty string")
        self.update(name=value)

    @property
    def status(self) -> Union[SandboxStatus, str]:
        """The current lifecycle state, fetched fresh from the daemon on every access."""
        return self.info().status

    def info(self) -> SandboxInfo:
        """Fetches the sandbox's current description from the daemon (always a fresh
        request, unlike Tensorlake's cached ``info()``)."""
        self._info = SandboxInfo.from_json(self._client.request_json("GET", self._route))
        return self._info

    def update(
        self,
        name: Optional[str] = None,
        *,
        allow_unauthenticated_access: Optional[bool] = None,
        exposed_ports: Optional[List[int]] = None,
        network: Union[NetworkConfig, ClearNetworkPolicy, None] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> SandboxInfo:
        """Renames the sandbox and/or replaces its egress rules (``labels``: sandfork's).

        ``network=NetworkConfig(...)`` replaces ``allow_out``/``deny_out``;
        ``NetworkConfig(allow_internet_access=False)`` with no ``allow_out`` denies every
        IPv4 destination (``deny_out=["0.0.0.0/0"]``);
        ``CLEAR_NETWORK_POLICY`` removes every rule. Internet access itself cannot
        be turned on for a sandbox created without it (the daemon answers 422).
        ``allow_unauthenticated_access=True`` serves the sandbox's ports through the
        gateway without a token; ``exposed_ports`` limits the gateway to those ports.
        """
        body = update_body(name, allow_unauthenticated_access, exposed_ports, network, labels)
        if not self._client.features().update_sandbox:
            raise errors.needs_newer_daemon("updating a sandbox (rename, egress rules)", "PATCH /v1/sandboxes/{id}")
        self._info = SandboxInfo.from_json(self._client.request_json("PATCH", self._route, json_body=body))
        return self._info

    def get_url(self, port: int, path: str = "/", *, expires_in: int = 3600, signed: bool = True) -> str:
        """The URL of ``path`` on ``port`` through the daemon's gateway (HTTP, WebSocket,
        SSE): with a signature that opens the port for ``expires_in`` seconds
        (``signed=False``: bare, for public ports or a client that sends
        :meth:`port_token`). On the Unix socket the URL starts with the daemon's public URL
        or TCP listener (what a browser opens); a daemon with neither gives
        ``http+unix://SOCKET:PATH``."""
        check_str("path", path, none_ok=False)
        access = self._port_access(port, expires_in)
        route, _, query = str(access["signed_path"] if signed else access["path"]).partition("?")
        path = self._client.endpoint.base_path + route.rstrip("/") + "/" + path.lstrip("/") + (f"?{query}" if query else "")
        ep = self._client.endpoint
        if ep.scheme == "unix" and access.get("base_url"):
            return str(access["base_url"]).rstrip("/") + path
        if ep.scheme == "unix":
            return f"http+unix://{ep.socket_path}:{path}"
        host = f"[{ep.host}]" if ":" in ep.host else ep.host
        return f"{ep.scheme}://{host}:{ep.port}{path}"

    def get_host(self, port: int) -> str:
        """The host name of ``port`` for host-based routing (``{port}-{id}.<domain>``;
        connect to the daemon's address with it as ``Host``)."""
        return str(self._port_access(port, 60)["host"])

    def port_token(self) -> str:
        """The access token that opens every port of this sandbox (send it as
        ``X-Sandfork-Access-Token``)."""
        return str(self._port_access(1, 60)["access_token"])

    def rotate_port_token(self) -> str:
        """Revokes every access token and signed URL of this sandbox made so far; returns
        the new access token."""
        return str(self._client.request_json("POST", f"{self._route}/access-token")["access_token"])

    def _port_access(self, port: int, expires_in: int) -> Dict[str, Any]:
        body = {"port": check_int("port", port, minimum=1), "expires_in_secs": check_int("expires_in", expires_in, minimum=1)}
        return self._client.request_json("POST", f"{self._route}/port-urls", json_body=body)

    def events(self, *, since: Optional[int] = 0, follow: bool = True) -> EventStream:
        """This sandbox's events (created, started, checkpointed, suspended, resumed,
        terminated, failed, oom, ...): the kept ones after ``since`` first (``None``: only
        new ones), then new ones as they happen unless ``follow=False``."""
        return EventStream(self._client, self.id, since, follow)

    def watch_dir(self, path: str, *, recursive: bool = False) -> FileWatch:
        """Watches directory ``path`` (with ``recursive``, the directories under it too):
        an iterator of :class:`~sandfork.events.FileEvent`, live once this returns; close
        it when done (an open watch makes a memory checkpoint wait for it, then refuse)."""
        return FileWatch(self._client, self._route, path, recursive)

    def stats(self) -> SandboxStats:
        """What the running sandbox uses now: CPU time, memory, processes, root disk and
        network (reading it does not count as activity for the idle timeout)."""
        return SandboxStats.from_json(self._client.request_json("GET", f"{self._route}/stats"))

    def set_timeout(self, timeout_secs: int, *, on_timeout: Optional[str] = None) -> SandboxInfo:
        """Sets the idle timeout, counted from now (0: never), and optionally what it does
        (``"terminate"`` or ``"suspend"``; a suspended sandbox resumes on its next exec,
        file or process request). ``info().expires_at`` tells when it passes."""
        secs = check_int("timeout_secs", timeout_secs, minimum=0, none_ok=False)
        body = drop_none(timeout_secs=secs, on_timeout=check_on_timeout(on_timeout))
        self._info = SandboxInfo.from_json(self._client.request_json("PATCH", self._route, json_body=body))
        return self._info

    def update_network(
        self,
        *,
        allow_out: Optional[List[str]] = None,
        deny_out: Optional[List[str]] = None,
    ) -> SandboxInfo:
        """Replaces the egress lists of a sandbox with internet access, live: no restart,
        running processes keep going. Each list holds IPv4 addresses, CIDRs, hostnames and
        wildcards (``*.example.com``: any name below example.com). ``None`` leaves a list
        as it is, ``[]`` empties it. A non-empty ``allow_out`` allows only what it names;
        ``deny_out`` wins. Names are enforced for DNS and for connections: only addresses
        the sandbox's resolver gave for an allowed name open, so connecting to an address
        directly or through a rebinding answer is blocked. Connections made under the old
        lists to addresses learned from names are cut until the name is resolved again."""
        body = drop_none(allow_out=egress_rules("allow_out", allow_out), deny_out=egress_rules("deny_out", deny_out))
        if not body:
            raise errors.InvalidArgumentError("update_network needs allow_out or deny_out", code="invalid_argument")
        self._info = SandboxInfo.from_json(self._client.request_json("PATCH", self._route, json_body=body))
        return self._info

    def update_labels(
        self,
        set: Optional[Mapping[str, str]] = None,  # noqa: A002 - the API's field name
        remove: Optional[Iterable[str]] = None,
    ) -> Dict[str, str]:
        """Sets the labels in ``set`` and removes the keys in ``remove`` in one step (no
        read-modify-write race with another client); returns the labels the sandbox has
        now. A key is 1 to 63 letters, digits, ``.``, ``_``, ``-`` or ``/``; a value at most
        256 characters; at most 64 labels."""
        if isinstance(remove, (str, bytes)):
            raise errors.ArgumentTypeError(f"remove must be a list of label keys, got the string {remove!r}")
        body = drop_none(set=check_str_map("set", set), remove=list(remove) if remove is not None else None)
        if not body:
            raise errors.InvalidArgumentError("update_labels needs set or remove", code="invalid_argument")
        doc = self._client.request_json("PATCH", f"{self._route}/labels", json_body=body)
        labels = dict((doc or {}).get("labels") or {})
        if self._info is not None:
            self._info.labels = labels
        return labels

    def terminate(self) -> None:
        """Stops the sandbox and frees everything it used. Safe to call twice."""
        self._owned = False
        doc = self._client.request_json("DELETE", self._route, unbounded=True)
        self._info = SandboxInfo.from_json(doc or {"id": self.id, "state": "terminated"})

    def close(self) -> None:
        """Releases the handle; the sandbox keeps running (the handle holds no connection)."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            try:
                self.terminate()
            except errors.NotFoundError:
                pass

    # --- commands --------------------------------------------------------

    def run(
        self,
        command: Command,
        args: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        user: Optional[ProcessUser] = None,
        *,
        stdin: Union[None, str, bytes] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> CommandResult:
        """Runs a command to completion and returns its output and exit code.

        Args:
            command: The program (looked up in ``PATH``), or a list of program and arguments.
            args: Its arguments.
            env: Extra environment variables.
            working_dir: Directory to run in.
            timeout: Seconds after which the command is killed (then
                ``result.timed_out`` is true).
            user: User to run as (a name, ``"uid:gid"``, a ``ProcessUserSpec``
                or a dict); the image's default user when omitted.
            stdin: Text or bytes fed to its standard input (sandfork).
            on_stdout, on_stderr: Called with each line of output, without its
                newline, as it arrives (sandfork; the output is then streamed).

        ``result.stdout``/``stderr`` are the lines joined with ``"\\n"`` (one
        trailing newline removed); ``stdout_bytes``/``stderr_bytes`` are exact.
        A non-zero exit is not an error: check ``result.exit_code``.

        Raises:
            BadRequestError: The command could not be started (code ``exec_failed``).
        """
        if on_stdout is not None or on_stderr is not None:
            return self.stream(command, args, env, working_dir, timeout, stdin, on_stdout=on_stdout, on_stderr=on_stderr, user=user).wait()
        body = exec_body(command, args, env, working_dir, timeout, stdin, user)
        body["stream"] = False
        return CommandResult.from_json(self._client.request_json("POST", self._route + "/exec", json_body=body, unbounded=True))

    def stream(
        self,
        command: Command,
        args: Optional[Iterable[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        user: Optional[ProcessUser] = None,
    ) -> OutputStream:
        """Runs a command and iterates over its output as it is produced (sandfork).

        Returns an iterator of :class:`~sandfork.OutputEvent` chunks; once
        exhausted, its ``.result`` is the :class:`~sandfork.CommandResult`::

            it = sb.stream("sh", ["-c", "echo a; sleep 1; echo b"])
            for event in it:
                print(event.stream, event.data, end="")
            print(it.result.exit_code)
        """
        body = exec_body(command, args, env, working_dir, timeout, stdin, user)
        body["stream"] = True
        response = self._client.open("POST", self._route + "/exec", json_body=body, unbounded=True)
        return OutputStream(response, on_stdout=on_stdout, on_stderr=on_stderr)

    # --- background processes --------------------------------------------

    def start_process(
        self,
        command: Command,
        args: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        working_dir: Optional[str] = None,
        stdin_mode: Union[StdinMode, str] = StdinMode.CLOSED,
        stdout_mode: Union[OutputMode, str] = OutputMode.CAPTURE,
        stderr_mode: Union[OutputMode, str] = OutputMode.CAPTURE,
        user: Optional[ProcessUser] = None,
        name: Optional[str] = None,
        restart: Union[RestartPolicyConfig, Mapping[str, Any], None] = None,
        health_check: Union[ProcessHealthCheck, Mapping[str, Any], None] = None,
        *,
        stdin: Union[None, str, bytes] = None,
    ) -> Process:
        """Starts a command in the background and returns its :class:`~sandfork.Process`
        (a ``ProcessInfo`` with methods).

        Args:
            stdin_mode: ``CLOSED`` (end-of-file at once, the default) or ``PIPE``
                (fed by ``write_stdin`` until ``close_stdin``).
            stdout_mode, stderr_mode: ``CAPTURE`` (buffered, readable with
                ``get_stdout``/``follow_stdout``...) or ``DISCARD``.
            name: Makes the process managed and addressable by this name.
            restart: A :class:`RestartPolicyConfig` (or dict): restarts on exit.
            health_check: A :class:`ProcessHealthCheck` (or dict).
            stdin: Fixed input fed to the process, then end-of-file (sandfork).

        Its output is buffered by the sandbox, so it can be read later, from
        any handle on this sandbox (``Sandbox.connect(id).get_process(pid)``).
        """
        body = exec_body(command, args, env, working_dir, None, stdin, user)
        stdin_m = check_enum("stdin_mode", StdinMode, stdin_mode if stdin_mode is not None else StdinMode.CLOSED)
        stdout_m = check_enum("stdout_mode", OutputMode, stdout_mode if stdout_mode is not None else OutputMode.CAPTURE)
        stderr_m = check_enum("stderr_mode", OutputMode, stderr_mode if stderr_mode is not None else OutputMode.CAPTURE)
        managed = drop_none(name=process_name(name), restart=_restart_doc(restart), health_check=_health_doc(health_check))
        if self._client.features().managed_processes:
            body.update(stdin_mode=stdin_m.value, stdout_mode=stdout_m.value, stderr_mode=stderr_m.value, **managed)
        else:
            if managed or stdout_m != OutputMode.CAPTURE or stderr_m != OutputMode.CAPTURE:
                wanted = ", ".join(sorted(set(managed) | ({"stdout_mode/stderr_mode"} if stdout_m != OutputMode.CAPTURE or stderr_m != OutputMode.CAPTURE else set())))
                raise errors.needs_newer_daemon(f"managed processes and output modes ({wanted})", "POST /v1/sandboxes/{id}/processes/{pid}/restart")
            if stdin_m == StdinMode.CLOSED and stdin is None:
                body["stdin"] = ""  # this daemon gives every process a pipe: close it at once
        doc = self._client.request_json("POST", self._route + "/processes", json_body=body)
        info = ProcessInfo.from_json(doc)
        if "stdin_writable" not in doc:
            info.stdin_writable = stdin_m == StdinMode.PIPE and stdin is None and info.running
        return Process(self, info)

    def list_processes(self) -> TracedList[Process]:
        """Every background process of this sandbox (running or ended)."""
        doc = self._client.request_json("GET", self._route + "/processes")
        return TracedList(Process(self, ProcessInfo.from_json(d)) for d in (doc or {}).get("processes", []))

    def _process_path(self, process: Union[int, str]) -> str:
        return f"{self._route}/processes/{seg(process)}"

    def get_process(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> Process:
        """The process with this pid or managed-process name.

        Raises:
            RemoteAPIError: Status 404 when there is no such process.
        """
        target = process_selector(process, pid)
        return Process(self, ProcessInfo.from_json(self._client.request_json("GET", self._process_path(target))))

    def kill_process(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> Traced[None]:
        """Ends a process: the daemon's ``DELETE`` of it (a managed process is no longer
        supervised), or SIGKILL on daemons without that route."""
        target = process_selector(process, pid)
        if self._client.features().delete_process:
            self._client.request("DELETE", self._process_path(target))
        else:
            self._client.request("POST", self._process_path(target) + "/signal", json_body={"signal": 9})
        return Traced(None, None)

    def restart_process(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> Process:
        """Restarts a process; a managed process gets a new pid."""
        target = process_selector(process, pid)
        if not self._client.features().managed_processes:
            raise errors.needs_newer_daemon("restarting processes", "POST /v1/sandboxes/{id}/processes/{pid}/restart")
        doc = self._client.request_json("POST", self._process_path(target) + "/restart", unbounded=True)
        return Process(self, ProcessInfo.from_json(doc))

    def send_signal(self, process: Union[int, str] = UNSET, signal: SignalLike = UNSET, *, pid: Union[int, str] = UNSET) -> SendSignalResponse:
        """Sends ``signal`` (a number, a name or ``signal.Signals``) to a process."""
        target = process_selector(process, pid)
        if signal is UNSET:
            raise TypeError("missing required argument: `signal`")
        self._client.request("POST", self._process_path(target) + "/signal", json_body={"signal": signal_value(signal)})
        return SendSignalResponse(success=True)

    def write_stdin(self, process: Union[int, str] = UNSET, data: Union[bytes, str] = UNSET, *, pid: Union[int, str] = UNSET) -> Traced[None]:
        """Writes bytes (or UTF-8 text) to a process started with ``stdin_mode=PIPE``."""
        target = process_selector(process, pid)
        if data is UNSET:
            raise TypeError("missing required argument: `data`")
        body = check_bytes("data", data)
        self._client.request("POST", self._process_path(target) + "/stdin", body=body, headers={"Content-Type": "application/octet-stream"})
        return Traced(None, None)

    def close_stdin(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> Traced[None]:
        """Closes a process's standard input (it then reads end-of-file)."""
        target = process_selector(process, pid)
        self._client.request("POST", self._process_path(target) + "/stdin/close")
        return Traced(None, None)

    def get_stdout(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> OutputResponse:
        """The standard output a process has produced so far, as lines."""
        return self._buffered(process_selector(process, pid), ("stdout",))

    def get_stderr(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> OutputResponse:
        """The standard error a process has produced so far, as lines."""
        return self._buffered(process_selector(process, pid), ("stderr",))

    def get_output(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> OutputResponse:
        """Standard output and error so far, as lines in the order they arrived."""
        return self._buffered(process_selector(process, pid), ("stdout", "stderr"))

    def follow_stdout(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> TracedList[OutputEvent]:
        """Every line of standard output (buffered, then live), returned once the
        process exits (as in Tensorlake: the call blocks until then)."""
        return TracedList(_line_events(self.iter_output(process_selector(process, pid)), ("stdout",)))

    def follow_stderr(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> TracedList[OutputEvent]:
        """Every line of standard error, returned once the process exits."""
        return TracedList(_line_events(self.iter_output(process_selector(process, pid)), ("stderr",)))

    def follow_output(self, process: Union[int, str] = UNSET, *, pid: Union[int, str] = UNSET) -> TracedList[OutputEvent]:
        """Every line of standard output and error, returned once the process exits.

        To handle output while the process runs, iterate :meth:`iter_output` instead.
        """
        return TracedList(_line_events(self.iter_output(process_selector(process, pid)), ("stdout", "stderr")))

    def iter_output(self, process: Union[int, str], offset: int = 0, stderr_offset: int = 0, follow: bool = True) -> OutputStream:
        """Iterates over a process's output as chunks while it runs (sandfork's
        streaming; see :meth:`Process.output`)."""
        target = process_selector(process, UNSET)
        query = {"offset": offset, "stderr_offset": stderr_offset or None, "follow": follow}
        response = self._client.open("GET", self._process_path(target) + "/output", query=query, unbounded=True)
        return OutputStream(response, collect=False, require_exit=follow)

    def _buffered(self, target: Union[int, str], streams: Sequence[str]) -> OutputResponse:
        pid = target if isinstance(target, int) else self.get_process(target).pid
        lines = [e.line for e in _line_events(self.iter_output(target, follow=False), streams)]
        return OutputResponse(pid=pid, lines=lines, line_count=len(lines))

    # --- checkpoints, forks, suspend ---------------------------------------

    def checkpoint(
        self,
        wait: bool = True,
        timeout: Optional[float] = 300,
        poll_interval: float = 1.0,
        checkpoint_type: Union[CheckpointType, SnapshotType, str, None] = None,
        wait_until: Union[SnapshotWaitCondition, str] = SnapshotWaitCondition.LOCAL_READY,
        *,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        hooks: Optional[List[Mapping[str, Any]]] = None,
    ) -> Optional[Snapshot]:
        """Captures the sandbox as a :class:`~sandfork.Snapshot` (a ``SnapshotInfo``);
        the sandbox keeps running.

        Args:
            wait: ``False`` starts the checkpoint on a background thread and
                returns ``None`` at once, as in Tensorlake (failures are logged to
                the ``sandfork`` logger). Find the snapshot with ``list_snapshots()``.
            timeout: Seconds to wait for the daemon (``None``: as long as it takes).
            poll_interval: Accepted; sandfork's checkpoint answers when complete.
            checkpoint_type: ``FILESYSTEM`` (disk only, the default) or
                ``MEMORY`` (disk, memory and processes, for warm restores).
            wait_until: ``"local_ready"`` (usable on this daemon: when the call
                returns) or ``"completed"`` (also in the daemon's object store, when
                it has one, so that any node of the cluster restores it).
            name: Optional snapshot name (sandfork).
            labels: Free-form key/value labels of the snapshot (sandfork).
            hooks: Commands (``Exec`` documents, e.g. ``{"command": "sh",
                "args": ["-c", "..."]}``) run in every sandbox restored from it,
                before it is handed out (sandfork).
        """
        if not isinstance(wait, bool):
            if isinstance(wait, (CheckpointType, str)):
                raise errors.ArgumentTypeError(f"checkpoint()'s first parameter is wait (a bool); give the type as checkpoint_type={wait!r}")
            raise errors.ArgumentTypeError(f"wait must be True or False, got {type(wait).__name__} {wait!r}")
        check_number("timeout", timeout)
        check_number("poll_interval", poll_interval)
        check_wait_until(wait_until)
        kind = check_enum("checkpoint_type", CheckpointType, checkpoint_type).value if checkpoint_type is not None else None
        hooks_list = [dict(h) for h in hooks] if hooks else None
        body = drop_none(type=kind, name=check_str("name", name), hooks=hooks_list, labels=check_str_map("labels", labels) or None)
        completed = str(getattr(wait_until, "value", wait_until)) == "completed"
        if not wait:
            threading.Thread(target=self._checkpoint_in_background, args=(body, timeout, completed), name=f"sandfork-checkpoint-{self.id}", daemon=True).start()
            return None
        return self._checkpoint(body, timeout, completed)

    def _checkpoint(self, body: Dict[str, Any], timeout: Optional[float], completed: bool = False) -> Snapshot:
        doc = self._client.request_json("POST", self._route + "/checkpoint", json_body=body, timeout=timeout, unbounded=timeout is None)
        snap = Snapshot(doc, self._client)
        if completed and not snap.published:
            try:
                snap.publish()
            except errors.UnsupportedError:
                pass  # no object store: completed where it is
        return snap

    def _checkpoint_in_background(self, body: Dict[str, Any], timeout: Optional[float], completed: bool = False) -> None:
        try:
            snap = self._checkpoint(body, timeout, completed)
            log.info("checkpoint of sandbox %s done: snapshot %s", self.id, snap.id)
        except Exception:  # noqa: BLE001 - nobody waits for this thread; log it
            log.exception("checkpoint of sandbox %s (started with wait=False) failed", self.id)

    def snapshot(self, *args: Any, **kwargs: Any) -> Optional[Snapshot]:
        """Alias of :meth:`checkpoint`."""
        return self.checkpoint(*args, **kwargs)

    def fork(
        self,
        count: int = 1,
        *,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        per_child: Optional[List[Mapping[str, Any]]] = None,
        name_prefix: Optional[str] = None,
        timeout_secs: Optional[int] = None,
    ) -> "ForkResult[Sandbox]":
        """Checkpoints memory in place once and starts ``count`` independent copies (sandfork).

        The source keeps its id and keeps running. ``per_child`` is a list of
        ``{"env": ..., "labels": ...}`` (by index, added to ``env``/``labels``);
        children are named ``<name_prefix>-<index>`` when a prefix is given and
        get ``timeout_secs`` as their idle timeout. Children succeed or fail
        independently: the :class:`~sandfork.ForkResult` is a list of the
        sandboxes that started, with ``.errors`` for those that did not
        (call ``.raise_for_errors()`` to turn any failure into an exception).
        The snapshot the children came from stays (``result.snapshot_id``).
        """
        body = fork_body(count, env, secrets, labels, per_child, name_prefix, timeout_secs)
        doc = self._client.request_json("POST", self._route + "/fork", json_body=body, unbounded=True)
        return ForkResult.from_json(doc, self._client, source_sandbox_id=self.id)

    def copy(self, *, times: int = 1, request_timeout: Optional[float] = None) -> "ForkResult[Sandbox]":
        """``times`` live copies of this sandbox (memory, processes and files).

        Returns a :class:`~sandfork.ForkResult`: a list of the connected copies
        that started, with Tensorlake's ``CopySandboxResponse`` shape too
        (``.source_sandbox_id``, ``.sandboxes`` with ``.sandbox_id``,
        ``.status``, ``.reason``). The intermediate snapshot is deleted.
        """
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise errors.SandboxError("times must be a positive integer")
        check_number("request_timeout", request_timeout)
        result = self.fork(times)
        if result.snapshot_id:
            try:
                Snapshot.delete_by_id(result.snapshot_id, client=self._client)
            except errors.NotFoundError:
                pass
        return result

    def suspend(self, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> None:
        """Checkpoints memory and stops the sandbox, keeping its id and name (named sandboxes only).

        The daemon answers once the sandbox is suspended; ``wait`` then only
        decides whether the SDK confirms the state.
        """
        check_bool("wait", wait, none_ok=False)
        info = SandboxInfo.from_json(self._client.request_json("POST", self._route + "/suspend", unbounded=True))
        self._info = info
        if wait:
            self._settle(info, timeout, poll_interval, SandboxStatus.SUSPENDED, "suspend")

    def resume(self, wait: bool = True, timeout: float = 300, poll_interval: float = 1.0) -> None:
        """Brings a suspended sandbox back with the same id, files and processes."""
        check_bool("wait", wait, none_ok=False)
        info = SandboxInfo.from_json(self._client.request_json("POST", self._route + "/resume", unbounded=True))
        self._info = info
        if wait:
            self._settle(info, timeout, poll_interval, SandboxStatus.RUNNING, "resume")

    def list_snapshots(self) -> TracedList[Snapshot]:
        """Snapshots taken from this sandbox."""
        return TracedList(Snapshot.list(source=self.id, client=self._client))

    # --- daemon ----------------------------------------------------------------

    def health(self) -> HealthResponse:
        """``healthy`` when the daemon answers and this sandbox is running."""
        doc = self._client.request_json("GET", "/v1/health") or {}
        return HealthResponse(healthy=doc.get("status") == "ok" and self.info().status == SandboxStatus.RUNNING)

    def daemon_info(self) -> DaemonInfo:
        """The daemon's version, this sandbox's age (``uptime_secs``) and its process counts."""
        doc = self._client.request_json("GET", "/v1/health") or {}
        info = self.info()
        procs = self.list_processes()
        age = (datetime.now(timezone.utc) - info.created_at).total_seconds() if info.created_at else 0
        return DaemonInfo(
            version=str(doc.get("version", "")), uptime_secs=max(0, int(age)),
            running_processes=sum(1 for p in procs if p.running), total_processes=len(procs),
        )  # fmt: skip

    # --- terminals, in Tensorlake's shape ----------------------------------------

    def create_pty_session(self, command: str, args: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None, working_dir: Optional[str] = None, rows: int = 24, cols: int = 80) -> Dict[str, str]:
        """Starts ``command`` on a new terminal without attaching: ``{"session_id", "token"}``
        for :meth:`connect_pty` (the token is the client's own; sessions need no other)."""
        body = drop_none(command=check_str("command", command, none_ok=False), args=list(args) if args else None, env=dict(env) if env else None, working_dir=working_dir, rows=rows, cols=cols)
        return {"session_id": str(self.pty.start(body)), "token": self._client.token or ""}

    def pty_ws_url(self, session_id: str, token: str) -> str:
        """The WebSocket URL of session ``session_id`` (see :meth:`PtyCommands.ws_url`)."""
        return self.pty.ws_url(_session_pid(session_id))

    def connect_pty(self, session_id: str, token: str, *, on_data: Optional[Callable[[bytes], None]] = None, on_exit: Optional[Callable[[Optional[int]], None]] = None, connect_timeout: float = 10.0) -> PtySession:
        """Attaches to terminal session ``session_id`` (output from what is still buffered)."""
        return self.pty.connect(_session_pid(session_id), on_data=on_data, on_exit=on_exit)

    def create_pty(self, command: str, args: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None, working_dir: Optional[str] = None, rows: int = 24, cols: int = 80, *, on_data: Optional[Callable[[bytes], None]] = None, on_exit: Optional[Callable[[Optional[int]], None]] = None, connect_timeout: float = 10.0) -> PtySession:
        """Starts ``command`` on a new ``cols`` x ``rows`` terminal and attaches to it (see
        :attr:`pty` for the full surface)."""
        return self.pty.create(command, args, cols=cols, rows=rows, env=env, working_dir=working_dir, on_data=on_data, on_exit=on_exit)

    # --- Tensorlake features sandfork does not have --------------------------------

    def connect_desktop(self, port: int = 5901, password: Optional[str] = None, shared: bool = True, connect_timeout: float = 10.0) -> Any:
        """Remote desktops are not supported: raises ``NotImplementedError``."""
        raise errors.not_supported("remote desktop (VNC)", plural=False)

    def logs(self, *, since: Optional[int] = None, tail: Optional[int] = None, follow: bool = False, process: Union[int, str, None] = None, stream: Optional[str] = None) -> LogStream:
        """The sandbox log: each line its background processes write (stdout as ``info``,
        stderr as ``error``), with when; from line ``since`` or the last ``tail`` lines;
        ``follow`` keeps streaming (a memory checkpoint ends a followed log: ask again from
        the next ``seq``). Filter by ``process`` (pid or name) or ``stream``."""
        query = drop_none(
            since=check_int("since", since, minimum=0), tail=check_int("tail", tail, minimum=0),
            follow="true" if follow else None, process=None if process is None else str(process),
            stream=check_str("stream", stream),
        )  # fmt: skip
        return LogStream(self._client, self._route, query)

    def get_logs(
        self,
        *,
        levels: Optional[List[Union[SandboxLogLevel, str]]] = None,
        process_ids: Optional[List[str]] = None,
        next_token: Optional[str] = None,
        head: Optional[int] = None,
        tail: Optional[int] = None,
        body: Optional[str] = None,
    ) -> "Traced[SandboxLogsResponse]":
        """A page of the sandbox log (Tensorlake's shape: a traced result, ``.value``): ``levels`` (``info`` is stdout,
        ``error`` stderr), ``process_ids`` (pids or names), ``body`` (a substring),
        ``head`` (the first N after ``next_token``) or ``tail`` (the last N); pass the
        answer's ``next_token`` to read on."""
        wanted = {str(getattr(level, "value", level)) for level in levels or []}
        procs = {str(p) for p in process_ids or []}
        since = int(next_token) if next_token else None
        signals: List[SandboxLogSignal] = []
        last = since
        with self.logs(since=since, tail=tail) as lines:
            for e in lines:
                last = e.seq + 1
                if (wanted and e.level not in wanted) or (procs and str(e.pid) not in procs and e.process not in procs) or (body and body not in e.message):
                    continue
                signals.append(_log_signal(self.id, e))
                if head is not None and len(signals) >= head:
                    break
        return Traced(None, SandboxLogsResponse(logs=signals, next_token=str(last) if last is not None else None))

    def list_log_processes(self) -> "Traced[SandboxProcessLogFiltersResponse]":
        """The processes that have lines in the sandbox log (``.value``)."""
        seen: Dict[int, SandboxProcessLogFilter] = {}
        for e in self.logs():
            ns = int(e.timestamp.timestamp() * 1e9) if e.timestamp else 0
            f = seen.get(e.pid)
            if f is None:
                seen[e.pid] = SandboxProcessLogFilter(
                    process_id=str(e.pid), process_pid=str(e.pid), process_command=e.process, process_managed_id=e.process,
                    process_managed_name=e.process, first_seen=ns, last_seen=ns, log_count=1,
                )  # fmt: skip
            else:
                f.last_seen, f.log_count = ns, f.log_count + 1
        return Traced(None, SandboxProcessLogFiltersResponse(processes=list(seen.values())))

    def attach_file_system(self, file_system_id: str, mount_path: str, *, read_only: bool = False, prefetch: bool = False, snapshot_id: Optional[str] = None) -> SandboxInfo:
        """Attaching to a running sandbox is not supported: raises ``NotImplementedError``
        (mount volumes at create)."""
        raise _no_file_systems()

    def detach_file_system(self, mount_path: str) -> SandboxInfo:
        """File systems are not supported: raises ``NotImplementedError``."""
        raise _no_file_systems()

    def list_file_systems(self) -> List[FileSystemMount]:
        """File systems are not supported: raises ``NotImplementedError``."""
        raise _no_file_systems()

    # --- internals ---------------------------------------------------------

    def _cached_info(self) -> SandboxInfo:
        return self._info if self._info is not None else self.info()

    def _terminate_quietly(self) -> None:
        try:
            self.terminate()
        except errors.SandboxError:
            pass

    def _wait_started(self, info: SandboxInfo, budget: float) -> None:
        """Waits until a new sandbox leaves ``PENDING``; deletes it if it does not in time."""
        deadline = time.monotonic() + budget
        delay = 0.02
        while info.status == SandboxStatus.PENDING:
            if time.monotonic() > deadline:
                self._terminate_quietly()
                raise errors.SandboxError(f"Sandbox {self.id} did not start within {budget:g}s", code="timed_out")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            info = self.info()
        if info.status != SandboxStatus.RUNNING:
            detail = f": {info.error}" if info.error else ""
            if info.status in (SandboxStatus.FAILED, SandboxStatus.TERMINATED, SandboxStatus.TERMINATING):
                raise errors.SandboxError(f"Sandbox {self.id} terminated during startup{detail}", code="failed")
            raise errors.SandboxError(f"Sandbox {self.id} became {info.status} during startup{detail}", code="failed")

    def _settle(self, info: SandboxInfo, timeout: Optional[float], poll_interval: float, target: SandboxStatus, what: str) -> None:
        """Polls while the sandbox is in a transitional state; raises unless it reaches ``target``."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        delay = 0.02
        cap = max(0.02, min(float(poll_interval or 0.5), 0.5))
        while info.status in _STARTING and info.status != target:
            if time.monotonic() > deadline:
                raise errors.SandboxError(f"Sandbox {self.id} did not {what} within {timeout:g}s", code="timed_out")
            time.sleep(delay)
            delay = min(delay * 2, cap)
            info = self.info()
        if info.status != target:
            detail = f": {info.error}" if info.error else ""
            raise errors.SandboxError(f"Sandbox {self.id} is {info.status} after {what}{detail}", code="failed")


def check_on_timeout(value: Optional[str]) -> Optional[str]:
    """``on_timeout`` is ``"terminate"`` or ``"suspend"``."""
    if value is not None and value not in ("terminate", "suspend"):
        raise errors.InvalidArgumentError(f"on_timeout must be 'terminate' or 'suspend', not {value!r}", code="invalid_argument")
    return value


def list_sandboxes(
    client: Client, state: Union[None, str, SandboxStatus] = None, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None
) -> TracedList[SandboxInfo]:
    """``GET /v1/sandboxes`` as a list of :class:`SandboxInfo`."""
    wanted = check_str_map("labels", labels)
    query = {"state": _state_value(state), "name": check_str("name", name), "labels": json.dumps(wanted) if wanted else None}
    doc = client.request_json("GET", "/v1/sandboxes", query=query)
    return TracedList(SandboxInfo.from_json(d) for d in (doc or {}).get("sandboxes", []))


def update_body(
    name: Optional[str],
    allow_unauthenticated_access: Optional[bool],
    exposed_ports: Optional[List[int]],
    network: Union[NetworkConfig, ClearNetworkPolicy, None],
    labels: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    """The ``PATCH /v1/sandboxes/{id}`` body for Tensorlake's update arguments."""
    if name is None and allow_unauthenticated_access is None and exposed_ports is None and network is None and labels is None:
        raise errors.SandboxError("At least one sandbox update field must be provided.")
    body: Dict[str, Any] = drop_none(
        name=check_str("name", name), labels=check_str_map("labels", labels),
        public_ports=check_bool("allow_unauthenticated_access", allow_unauthenticated_access),
        exposed_ports=check_ports(exposed_ports),
    )  # fmt: skip
    if name is not None and not name:
        raise errors.SandboxError("sandbox name must be a non-empty string")
    if network is CLEAR_NETWORK_POLICY:
        body.update(allow_out=[], deny_out=[])
    elif isinstance(network, NetworkConfig):
        allowed = egress_rules("allow_out", list(network.allow_out or []))
        denied = egress_rules("deny_out", list(network.deny_out or []))
        if not network.allow_internet_access and not allowed:
            denied = ["0.0.0.0/0"]  # no internet and nothing allowed: deny every IPv4 destination
        body.update(allow_out=allowed, deny_out=denied)
    elif network is not None:
        raise errors.ArgumentTypeError(f"network must be a NetworkConfig or CLEAR_NETWORK_POLICY, got {type(network).__name__}")
    return body


def check_ports(ports: Optional[Iterable[int]]) -> Optional[List[int]]:
    """A port list for the daemon (``None`` stays ``None``)."""
    if ports is None:
        return None
    if isinstance(ports, (str, bytes)):
        raise errors.ArgumentTypeError(f"ports must be a list of port numbers, got {ports!r}")
    return [check_int("port", p, minimum=1) for p in ports]


def check_wait_until(wait_until: Any) -> str:
    value = getattr(wait_until, "value", wait_until)
    if value not in ("local_ready", "completed"):
        raise errors.SandboxError("wait_until must be 'local_ready' or 'completed'")
    return str(value)


def _restart_doc(restart: Any) -> Optional[Dict[str, Any]]:
    if restart is None:
        return None
    try:
        cfg = restart if isinstance(restart, RestartPolicyConfig) else RestartPolicyConfig(**dict(restart))
        return cfg.to_json()
    except (TypeError, ValueError) as e:
        raise errors.ArgumentValueError(f"invalid process restart config: {e}") from None


def _health_doc(health_check: Any) -> Optional[Dict[str, Any]]:
    if health_check is None:
        return None
    try:
        cfg = health_check if isinstance(health_check, ProcessHealthCheck) else ProcessHealthCheck(**dict(health_check))
        return cfg.to_json()
    except (TypeError, ValueError) as e:
        raise errors.ArgumentValueError(f"invalid process health check config: {e}") from None


def _line_events(stream: OutputStream, streams: Sequence[str]) -> List[OutputEvent]:
    """Splits a chunk stream into line events (timestamped on arrival) of ``streams``."""
    pending = {"stdout": "", "stderr": ""}
    events: List[OutputEvent] = []
    with stream:
        for chunk in stream:
            name = chunk.stream or "stdout"
            if name not in streams:
                continue
            text = pending[name] + chunk.line
            lines = text.split("\n")
            pending[name] = lines.pop()
            now = datetime.now(timezone.utc)
            events.extend(OutputEvent(line=line, timestamp=now, stream=name) for line in lines)
    now = datetime.now(timezone.utc)
    for name in streams:
        if pending.get(name):
            events.append(OutputEvent(line=pending[name], timestamp=now, stream=name))
    return events


def _state_value(state: Union[None, str, SandboxStatus]) -> Optional[str]:
    if state is None:
        return None
    try:
        return SandboxStatus(getattr(state, "value", state)).daemon_state
    except ValueError:
        return str(state)


def _no_proxy() -> errors.FeatureNotSupportedError:
    return errors.not_supported("sandbox proxy URLs", "sandfork talks to its daemon directly: pass api_url= (or client=) instead of proxy_url=")


def _session_pid(session_id: str) -> int:
    """The pid a terminal session id names."""
    text = str(session_id)
    if not text.isdigit() or int(text) < 1:
        raise errors.ArgumentValueError(f"invalid terminal session id {session_id!r}: it is the session's pid")
    return int(text)


def _log_signal(sandbox_id: str, e: LogEntry) -> SandboxLogSignal:
    """A sandbox log line in Tensorlake's record shape (timestamps in nanoseconds, OTel
    severity numbers: 9 info, 17 error)."""
    ns = int(e.timestamp.timestamp() * 1e9) if e.timestamp else 0
    attrs = json.dumps({"pid": e.pid, "process": e.process, "stream": e.stream})
    return SandboxLogSignal(timestamp=ns, uuid=str(e.seq), namespace="default", body=e.message, log_attributes=attrs, application=e.process, sandbox_id=sandbox_id, level=17 if e.level == "error" else 9)


def _no_file_systems() -> errors.FeatureNotSupportedError:
    return errors.not_supported(
        "file systems attached to a running sandbox",
        "mount volumes at create with file_systems=[FileSystemMount(...)]",
        plural=True,
    )



bind_sandbox_factory(lambda info, client: Sandbox(info.id, client=client, info=info, owned=True))
