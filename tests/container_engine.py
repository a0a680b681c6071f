"""A Docker engine for the container smoke test and bench/bench_container.py.

:func:`open_engine` uses ``$DOCKER_HOST`` when set; else, as root with ``dockerd`` installed,
starts a private daemon (its own data root, exec root and unix socket in a temporary folder, no
default bridge, no iptables rules, its own containerd namespace) that :meth:`Engine.close` stops
and deletes; else the default daemon if one answers. Where none can run it raises
:class:`EngineUnavailable` with the reason. Images are built by the repository's own scripts,
as a user would: ``scripts/offline-base-image.sh`` then ``scripts/build-image.sh``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class EngineUnavailable(RuntimeError):
    """No container engine can run here; the message says why."""


@dataclass
class Engine:
    """A reachable Docker daemon; ``private`` when this process started it."""

    docker_host: str
    private: bool = False
    dockerd: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    #: folders outside ``workdir`` the daemon creates when absent (containerd's shim sockets go
    #: to /run/containerd/s whatever its state folder): removed again if still empty
    leftovers: tuple[Path, ...] = ()
    #: unique per engine: names of what the tests create, so a shared daemon keeps the rest
    prefix: str = field(default_factory=lambda: f"kperf-test-{uuid.uuid4().hex[:8]}")

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment (minus KPERF_* settings) pointed at this daemon."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KPERF_")}
        env["DOCKER_HOST"] = self.docker_host
        return env

    def run(
        self,
        *argv: str,
        timeout_s: float = 60,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (``docker ...``, a script) against this daemon; raise on failure."""
        result = subprocess.run(
            argv,
            cwd=REPO,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                f"{result.stderr[-3000:]}"
            )
        return result

    def docker(self, *args: str, timeout_s: float = 60, check: bool = True) -> str:
        return self.run("docker", *args, timeout_s=timeout_s, check=check).stdout.strip()

    def inspect(self, ref: str, template: str) -> str:
        return self.docker("inspect", "-f", template, ref)

    def image_size_bytes(self, ref: str) -> int:
        return int(self.docker("image", "inspect", "-f", "{{.Size}}", ref))

    def installed_bytes(self, ref: str, packages: Sequence[str]) -> int:
        """Bytes of the files of ``packages`` (directories of the image's site-packages)."""
        code = (
            "import os, sysconfig; root = sysconfig.get_paths()['purelib']; "
            f"print(sum(os.path.getsize(os.path.join(d, f)) for p in {list(packages)!r} "
            "for d, _, fs in os.walk(os.path.join(root, p)) for f in fs))"
        )
        return int(self.docker("run", "--rm", "--network", "none", ref, "python", "-c", code))

    def wait_healthy(self, container: str, timeout_s: float = 120) -> float:
        """Seconds until the container's HEALTHCHECK reports healthy (raise if it does not)."""
        t0 = time.monotonic()
        status = ""
        while time.monotonic() - t0 < timeout_s:
            state = json.loads(self.inspect(container, "{{json .State}}"))
            status = (state.get("Health") or {}).get("Status", "")
            if status == "healthy":
                return time.monotonic() - t0
            if not state.get("Running"):
                break
            time.sleep(0.25)
        logs = self.run("docker", "logs", "--tail", "30", container, check=False)
        raise AssertionError(
            f"{container} not healthy after {time.monotonic() - t0:.1f} s (health {status!r}):\n"
            f"{logs.stdout}{logs.stderr}"
        )

    def remove_own(self) -> None:
        """Remove the containers, volumes, networks (and on a shared daemon, images) named with
        this engine's prefix; a private daemon's images go with its data root."""
        for kind, listing in (
            ("container", ["ps", "-aq", "--filter", f"name={self.prefix}"]),
            ("volume", ["volume", "ls", "-q", "--filter", f"name={self.prefix}"]),
            ("network", ["network", "ls", "-q", "--filter", f"name={self.prefix}"]),
        ):
            ids = sorted(set(self.docker(*listing, check=False).split()))
            if ids:
                extra = ["-f", "-v"] if kind == "container" else []
                self.docker(kind, "rm", *extra, *ids, check=False)
        if self.private:
            return
        listing = ["image", "ls", "--format", "{{.Repository}}:{{.Tag}}"]
        refs = self.docker(*listing, "--filter", f"reference={self.prefix}*", check=False).split()
        for ref in refs:  # the base stays while the classic builder's build stage uses it
            self.docker("image", "rm", ref, check=False)
        # that untagged build stage (Dockerfile: LABEL kperf.stage=build), then the base
        self.docker("image", "prune", "-f", "--filter", "label=kperf.stage=build", check=False)
        for ref in refs:
            self.docker("image", "rm", ref, check=False)

    def close(self) -> None:
        """Remove what the tests made; stop and delete a private daemon."""
        try:
            self.remove_own()
        finally:
            if self.private:
                self._stop_private()

    def _stop_private(self) -> None:
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.send_signal(signal.SIGTERM)
            try:
                self.dockerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.dockerd.kill()
                self.dockerd.wait()
        if self.workdir is not None:
            _unmount_below(self.workdir)
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.workdir)], check=False)
        for folder in self.leftovers:  # deepest first; one still in use is not empty
            with contextlib.suppress(OSError):
                folder.rmdir()


def _unmount_below(path: Path) -> None:
    """Lazily unmount every mount point at or below ``path`` (deepest first)."""
    root = str(path)
    with open("/proc/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1] for line in mounts]
    below = [p for p in points if p == root or p.startswith(root + "/")]
    for point in sorted(set(below), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _answers(docker_host: str | None, timeout_s: float = 10) -> bool:
    env = dict(os.environ)
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    try:
        result = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            env=env,
            capture_output=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _start_private(dockerd: str) -> Engine:
    workdir = Path(tempfile.mkdtemp(prefix="kperf-dockerd-"))
    shims = Path("/run/containerd/s")
    leftovers = tuple(p for p in (shims, shims.parent) if not p.exists())
    socket = workdir / "docker.sock"
    namespace = f"kperf-test-{os.getpid()}"
    log = open(workdir / "dockerd.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [
            dockerd,
            f"--data-root={workdir / 'data'}",
            f"--exec-root={workdir / 'exec'}",
            f"--pidfile={workdir / 'dockerd.pid'}",
            f"--host=unix://{socket}",
            # no docker0 bridge and no iptables rules: nothing shared with other daemons on
            # this machine; builds and the single-container run use the host network, and
            # compose's own bridge network is removed by `down`
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            # if a system containerd runs, keep apart from any other daemon using it
            f"--containerd-namespace={namespace}",
            f"--containerd-plugins-namespace={namespace}-plugins",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    engine = Engine(
        f"unix://{socket}", private=True, dockerd=process, workdir=workdir, leftovers=leftovers
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (workdir / "dockerd.log").read_text(errors="replace")[-1500:]
            engine.close()
            raise EngineUnavailable(f"dockerd exited {process.returncode}:\n{tail}")
        if socket.exists() and _answers(engine.docker_host, timeout_s=5):
            return engine
        time.sleep(0.5)
    tail = (workdir / "dockerd.log").read_text(errors="replace")[-1500:]
    engine.close()
    raise EngineUnavailable(f"dockerd did not answer within 60 s:\n{tail}")


def open_engine() -> Engine:
    """A daemon to build and run images on (see the module docstring for which)."""
    if shutil.which("docker") is None:
        raise EngineUnavailable("no docker CLI on PATH (Debian: apt-get install docker.io)")
    docker_host = os.environ.get("DOCKER_HOST")
    if docker_host:
        if _answers(docker_host):
            return Engine(docker_host)
        raise EngineUnavailable(f"DOCKER_HOST={docker_host} does not answer")
    dockerd = shutil.which("dockerd")
    if dockerd is not None and os.geteuid() == 0:
        return _start_private(dockerd)
    if _answers(None):
        return Engine("unix:///var/run/docker.sock")
    raise EngineUnavailable(
        "no container engine: DOCKER_HOST is unset, no daemon answers on the default socket, "
        "and a private dockerd needs root and dockerd on PATH (Debian: docker.io)"
    )


def build_base_image(engine: Engine, tag: str, tarball: str | None = None) -> str:
    """scripts/offline-base-image.sh: the debootstrapped base (reusing ``tarball`` if given)."""
    argv = ["bash", "scripts/offline-base-image.sh", "--tag", tag]
    if tarball:
        argv += ["--tarball", tarball]
    # a TMPDIR of this machine, which the new root's chroot does not have (as on a machine
    # whose TMPDIR is set): the script's chroot steps must not use it
    with tempfile.TemporaryDirectory(prefix="kperf-tmpdir-") as tmpdir:
        engine.run(*argv, timeout_s=900, env={"TMPDIR": tmpdir})
    return tag


def build_image(engine: Engine, base: str, tag: str, *extra: str) -> str:
    """scripts/build-image.sh: the kperf image on ``base``."""
    engine.run(
        "bash", "scripts/build-image.sh", "--base", base, "--tag", tag, "--", *extra, timeout_s=900
    )
    return tag
