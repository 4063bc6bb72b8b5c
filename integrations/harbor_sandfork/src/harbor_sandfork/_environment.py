"""Harbor's ``BaseEnvironment`` on sandfork: one sandbox per trial, built from the task's
Dockerfile by sandfork's builder; with ``fork`` the first trial of a task checkpoints its
started sandbox (memory included) and every further trial restores that checkpoint."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import shlex
import stat
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Mapping, Optional, TypeVar, Union, override

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import COMPOSE_FILE_NAME, require_agent_environment_definition
from harbor.models.task.config import EnvironmentConfig, NetworkMode
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import TrialPaths
from sandfork import CheckpointType, Client, Image, Sandbox
from sandfork import errors as sf_errors

from . import _images, _templates
from ._errors import SandforkConfigError, SandforkEnvironmentError, SandforkExecTimeoutError, SandforkUnsupportedError

T = TypeVar("T")
log = logging.getLogger(__name__)

ENVIRONMENT_TYPE = "sandfork"
LABEL = "harbor-sandfork"
# The daemon refuses request bodies over 1 MiB: a longer command goes through a script file.
INLINE_LIMIT = 512 * 1024
SCRATCH_DIR = "/tmp/.harbor-sandfork"


async def _io(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking SDK call on a worker thread (the SDK is synchronous)."""
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise SandforkConfigError(f"{name} must be true or false, not {value!r}")


class SandforkEnvironment(BaseEnvironment):
    """A Harbor environment on a sandfork daemon (``--env harbor_sandfork:SandforkEnvironment``).

    Environment kwargs (``--ek key=value``):

    - ``fork`` (default false): the first trial of a task checkpoints its started sandbox
      with its memory; every further trial of the task in this process restores it.
    - ``base_images``: a mapping (JSON object, or the path of a JSON file) from the
      Dockerfile's ``FROM`` images to sandfork images (default ``$HARBOR_SANDFORK_BASE_IMAGES``).
    - ``daemon_url``: the daemon, when not ``$SANDFORK_URL`` (the token is only ever read
      from ``$SANDFORK_TOKEN``).

    The trial's sandbox is ``self.sandbox`` (a :class:`sandfork.Sandbox`) once started.
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *args: Any,
        fork: Union[bool, str] = False,
        base_images: Union[None, str, Mapping[str, str]] = None,
        daemon_url: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        self._fork = _flag("fork", fork)
        self._base_images = _images.load_base_images(base_images)
        self._client = Client(url=daemon_url) if daemon_url else Client()
        self._sandbox: Optional[Sandbox] = None
        self._shell = "/bin/sh"
        self._restored = False
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs)
        if self._host_mounts:
            targets = ", ".join(str(m["target"]) for m in self._host_mounts)
            raise SandforkUnsupportedError(f"host directory mounts ({targets}) are not supported by sandfork: a sandbox mounts only sandfork volumes")

    # --- what the provider can do ---------------------------------------------------------

    @staticmethod
    @override
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
        )

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # cpus and memory_mb are cgroup limits; there are no reservations.
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @override
    def _validate_definition(self) -> None:
        if (self.environment_dir / COMPOSE_FILE_NAME).exists():
            raise SandforkUnsupportedError(
                f"Docker Compose task environments ({self.environment_dir / COMPOSE_FILE_NAME}) are not supported by sandfork: a trial runs in one sandbox"
            )
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandforkEnvironmentError("the sandfork environment is not started (call start first)")
        return self._sandbox

    # --- lifecycle ---------------------------------------------------------------------------

    @override
    async def start(self, force_build: bool) -> None:
        image = await self._image(force_build)
        if not self._fork:
            await self._start_fresh(image, "trial")
            return
        template = _templates.template(self._template_key(image), self._client)
        async with template.lock():
            if template.snapshot_id is None:
                # The first trial of the task: start, prepare, wait until healthy, checkpoint,
                # go on in it. The forks restore a sandbox whose services already run.
                await self._start_fresh(image, "trial")
                await self.run_healthcheck()
                snap = await _io(
                    self.sandbox.checkpoint,
                    checkpoint_type=CheckpointType.MEMORY,
                    labels={LABEL: "template", "harbor-task": self._label_value(self.environment_name)},
                )
                assert snap is not None
                template.snapshot_id = snap.snapshot_id
                self.logger.debug(f"sandfork: checkpointed {self.sandbox.id} as {snap.snapshot_id}")
                return
            snapshot_id = template.snapshot_id
        try:
            self._sandbox = await _io(Sandbox.create, snapshot_id=snapshot_id, labels=self._labels("fork"), client=self._client)
        except sf_errors.NotFoundError:
            # The snapshot went away (deleted by hand): this trial starts cold and takes a new one.
            self.logger.warning(f"sandfork: snapshot {snapshot_id} is gone; starting {self.environment_name} cold")
            async with template.lock():
                if template.snapshot_id == snapshot_id:
                    template.snapshot_id = None
            await self.start(force_build=False)
            return
        template.forks += 1
        self._restored = True
        await self._detect_shell()

    @override
    async def stop(self, delete: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        if sb is None:
            return
        if not delete:
            # Kept for inspection: suspended (files, processes and memory), not running.
            await _io(sb.suspend)
            self.logger.info(f"sandfork: kept sandbox {sb.id} suspended (`sandfork shell {sb.id}` resumes it; `sandfork rm {sb.id}` deletes it)")
            return
        await _io(sb.terminate)

    async def _start_fresh(self, image: str, role: str) -> None:
        self._sandbox = await _io(self._create, image, self._labels(role))
        try:
            await self._detect_shell()
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await _io(self.sandbox.terminate)
            self._sandbox = None
            raise

    def _create(self, image: str, labels: Dict[str, str]) -> Sandbox:
        kwargs: Dict[str, Any] = {"image": image, "labels": labels, "client": self._client, **self._network_kwargs()}
        entrypoint = self._image_entrypoint(image)
        if entrypoint:
            # As Harbor's Docker environment runs the container: the image's ENTRYPOINT
            # with `sh -c "sleep infinity"` as its command (services the entrypoint starts
            # then run beside the trial).
            kwargs["entrypoint"] = [*entrypoint, "sh", "-c", "sleep infinity"]
        env = self._startup_env()
        if env:
            kwargs["env"] = env
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory_mb = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if cpus is not None:
            kwargs["cpus"] = float(cpus)
        if memory_mb is not None:
            kwargs["memory_mb"] = int(memory_mb)
        if self._effective_storage_mb is not None:
            kwargs["disk_mb"] = int(self._effective_storage_mb)
        try:
            return Sandbox.create(**kwargs)
        except sf_errors.NotFoundError as e:
            raise SandforkEnvironmentError(f"the sandfork daemon has no image {image!r}: {e}") from e

    def _image_entrypoint(self, image: str) -> List[str]:
        try:
            return Image.get(image, client=self._client).entrypoint
        except sf_errors.NotFoundError:
            return []  # a registry reference not pulled yet: the create pulls it

    def _network_kwargs(self) -> Dict[str, Any]:
        policy = self.network_policy
        if policy.network_mode == NetworkMode.NO_NETWORK:
            # No network device besides loopback.
            return {"allow_internet_access": False}
        if policy.network_mode == NetworkMode.ALLOWLIST:
            return {"allow_internet_access": True, "allow_out": list(policy.allowed_hosts)}
        return {"allow_internet_access": True}

    def _labels(self, role: str) -> Dict[str, str]:
        return {LABEL: role, "harbor-task": self._label_value(self.environment_name), "harbor-session": self._label_value(self.session_id)}

    @staticmethod
    def _label_value(value: str) -> str:
        return "".join(c for c in value if c.isprintable())[:256]

    def _template_key(self, image: str) -> str:
        """What a restored sandbox shares with its template: the image and everything the
        sandbox was created with or prepared by."""
        policy = self.network_policy
        parts = {
            "daemon": self._client.url,
            "image": image,
            "cpus": self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT),
            "memory_mb": self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT),
            "storage_mb": self._effective_storage_mb,
            "network": [policy.network_mode.value, sorted(policy.allowed_hosts)],
            "env": self._startup_env(),
            "dirs": self._mount_targets(writable_only=True),
            "upload": self.environment_id if self.task_env_config.docker_image else None,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    async def _detect_shell(self) -> None:
        # Harbor's commands are written for bash (its Docker environment runs `bash -c`);
        # an image without bash gets /bin/sh.
        self._shell = "/bin/bash" if await _io(self._exists, "/bin/bash") else "/bin/sh"

    # --- the image ---------------------------------------------------------------------------

    async def _image(self, force_build: bool) -> str:
        dockerfile = _images.read_dockerfile(self.environment_dir)
        prebuilt = self.task_env_config.docker_image
        if prebuilt and (dockerfile is None or not force_build):
            return _images.map_image(prebuilt, self._base_images)
        if dockerfile is None:
            raise SandforkEnvironmentError(f"no Dockerfile in {self.environment_dir}")
        text = _images.rewrite_dockerfile(dockerfile, self._base_images)
        name = _images.image_name(self.environment_name, self.environment_id, text)
        async with _templates.named_lock("image:" + name):
            built = _BUILT.get(name)
            if built is not None and (not force_build or built):
                return name
            if not force_build and await _io(_images.image_exists, self._client, name):
                _BUILT[name] = False
                return name
            self.logger.debug(f"sandfork: building {name} from {self.environment_dir / 'Dockerfile'}")
            await _io(_images.build, self._client, self.environment_dir, name, text)
            _BUILT[name] = True
        return name

    # --- commands ------------------------------------------------------------------------------

    @override
    async def exec(
        self,
        command: str,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_sec: Optional[int] = None,
        user: Union[str, int, None] = None,
    ) -> ExecResult:
        sb = self.sandbox
        resolved_user = self._resolve_user(user)
        merged = self._merge_env(env)
        workdir = cwd or self.task_env_config.workdir
        on_stdout, on_stderr = self._streaming()
        try:
            result = await _io(
                _run, sb, [self._shell, "-c", command], merged, workdir, timeout_sec,
                None if resolved_user is None else str(resolved_user), on_stdout, on_stderr,
            )  # fmt: skip
        except sf_errors.BadRequestError as e:
            if e.code != "exec_failed":
                raise
            # The command could not start (an unknown user, a missing working directory).
            return ExecResult(stdout="", stderr=(e.message or str(e)) + "\n", return_code=126)
        if result.timed_out:
            raise SandforkExecTimeoutError(f"Command timed out after {timeout_sec} seconds")
        for name, truncated in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)):
            if truncated:
                self.logger.warning(f"sandfork: the {name} of {command[:80]!r} was cut at the daemon's limit (64 MiB)")
        code = 128 + result.signal if result.signal else result.exit_code
        return ExecResult(
            stdout=result.stdout_bytes.decode("utf-8", "replace"),
            stderr=result.stderr_bytes.decode("utf-8", "replace"),
            return_code=code,
        )

    def _streaming(self) -> tuple[Optional[Callable[[str], None]], Optional[Callable[[str], None]]]:
        """Output callbacks for Harbor's ``scoped_output_callback``: the SDK calls them on a
        worker thread, a line at a time; they hand each line to the event loop."""
        callback = self._output_callback()
        if callback is None:
            return None, None
        loop = asyncio.get_running_loop()

        def sender(stream: str) -> Callable[[str], None]:
            def send(line: str) -> None:
                asyncio.run_coroutine_threadsafe(callback(line + "\n", stream), loop)  # type: ignore[arg-type]

            return send

        return sender("stdout"), sender("stderr")

    @override
    async def attach(self) -> None:
        os.execvp("sandfork", ["sandfork", "shell", self.sandbox.id])

    # --- files ---------------------------------------------------------------------------------

    @override
    async def upload_file(self, source_path: Union[Path, str], target_path: str) -> None:
        await _io(self.sandbox.upload_file, str(source_path), target_path)

    @override
    async def upload_dir(self, source_dir: Union[Path, str], target_dir: str) -> None:
        await _io(_upload_tree, self.sandbox, Path(source_dir), PurePosixPath(target_dir))

    @override
    async def download_file(self, source_path: str, target_path: Union[Path, str]) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            await _io(self.sandbox.download_file, source_path, str(target))
        except sf_errors.NotFoundError as e:
            if isinstance(e, sf_errors.SandboxNotFoundError):
                raise
            raise FileNotFoundError(f"no file {source_path} in sandbox {self.sandbox.id}") from e

    @override
    async def download_dir(self, source_dir: str, target_dir: Union[Path, str]) -> None:
        await _io(_download_tree, self.sandbox, PurePosixPath(source_dir), Path(target_dir))

    @override
    async def is_dir(self, path: str, user: Union[str, int, None] = None) -> bool:
        entry = await _io(_stat, self.sandbox, path)
        return entry is not None and entry.type == "dir"

    @override
    async def is_file(self, path: str, user: Union[str, int, None] = None) -> bool:
        entry = await _io(_stat, self.sandbox, path)
        return entry is not None and entry.type == "file"

    def _exists(self, path: str) -> bool:
        return _stat(self.sandbox, path) is not None


# Images built by this process (True) or found on the daemon (False).
_BUILT: Dict[str, bool] = {}


# --- helpers run on worker threads -----------------------------------------------------------


def _run(
    sb: Sandbox,
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    timeout: Optional[int],
    user: Optional[str],
    on_stdout: Optional[Callable[[str], None]],
    on_stderr: Optional[Callable[[str], None]],
) -> Any:
    kwargs: Dict[str, Any] = {"env": env or None, "working_dir": cwd, "timeout": timeout, "user": user, "on_stdout": on_stdout, "on_stderr": on_stderr}
    if len(json.dumps(argv)) <= INLINE_LIMIT:
        return sb.run(argv, **kwargs)
    # Too long for one request: the command goes to a file the shell runs.
    script = f"{SCRATCH_DIR}/{uuid.uuid4().hex}.sh"
    sb.write_file(script, argv[-1] + "\n", mode=0o644)
    try:
        return sb.run([argv[0], script], **kwargs)
    finally:
        try:
            sb.remove(script)
        except sf_errors.SandboxError:
            pass


def _stat(sb: Sandbox, path: str) -> Any:
    try:
        return sb.stat(path)
    except sf_errors.NotFoundError as e:
        if isinstance(e, sf_errors.SandboxNotFoundError):
            raise
        return None
    except sf_errors.BadRequestError as e:
        if "not a directory" in (e.message or "").lower():
            return None
        raise


def _upload_tree(sb: Sandbox, source: Path, target: PurePosixPath) -> None:
    """Copies the directory ``source`` into ``target`` (made if missing): files with their
    modes, empty directories, and symbolic links as links."""
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is not a directory")
    sb.mkdir(str(target))
    links: List[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        remote = target / here.relative_to(source).as_posix()
        for name in sorted(dirnames):
            path = here / name
            if path.is_symlink():
                links.append((os.readlink(path), str(remote / name)))
            else:
                sb.mkdir(str(remote / name))
        for name in sorted(filenames):
            path = here / name
            if path.is_symlink():
                links.append((os.readlink(path), str(remote / name)))
            elif path.is_file():
                sb.upload_file(str(path), str(remote / name))
    if links:
        script = " && ".join(f"ln -sfn {shlex.quote(dest)} {shlex.quote(at)}" for dest, at in links)
        r = sb.run(["/bin/sh", "-c", script])
        if r.exit_code != 0:
            raise SandforkEnvironmentError(f"could not make the symbolic links of {source} in {target}: {r.stderr}")


def _download_tree(sb: Sandbox, source: PurePosixPath, target: Path) -> None:
    """Copies the sandbox directory ``source`` into ``target`` (made if missing),
    overwriting files there; symbolic links are made as links."""
    entry = _stat(sb, str(source))
    if entry is None:
        raise FileNotFoundError(f"no directory {source} in sandbox {sb.id}")
    if entry.type != "dir":
        raise NotADirectoryError(f"{source} in sandbox {sb.id} is not a directory")
    target.mkdir(parents=True, exist_ok=True)
    for child in sb.list_dir(str(source)).entries:
        remote = source / child.name
        local = target / child.name
        if child.type == "dir":
            _download_tree(sb, remote, local)
        elif child.type == "file":
            sb.download_file(str(remote), str(local))
            os.chmod(local, stat.S_IMODE(child.mode) or 0o644)
        elif child.type == "symlink":
            r = sb.run(["readlink", str(remote)])
            if r.exit_code != 0:
                raise SandforkEnvironmentError(f"could not read the link {remote} in sandbox {sb.id}: {r.stderr}")
            if local.is_symlink() or local.exists():
                local.unlink()
            os.symlink(r.stdout, local)
        # sockets, FIFOs and devices carry no content (Harbor's own transfers skip them)


__all__ = ["ENVIRONMENT_TYPE", "SandforkEnvironment"]
