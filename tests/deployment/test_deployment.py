"""Flower's deployment runtime on localhost: the repository's app, for real.

One SuperLink and two SuperNodes run as separate processes, as they would on
three machines: TLS everywhere (certificates from :mod:`privfed.deployment.certs`)
and SuperNode authentication on (only the two registered keys get in). Each
SuperNode's key is also its SecAgg+ identity, and each pins both SuperNodes'
keys (``supernode-peers.pub``), as ``privfed certs`` prints. The
``flwr`` CLI submits the app with a tiny configuration for two rounds with
SecAgg+, and the run directory the ServerApp writes is checked.

Every process is started in its own session and killed, with everything it
spawned, in a finalizer; logs are printed when something fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from privfed.deployment.certs import (
    CredentialPaths,
    generate_credentials,
    supernode_key_pair,
    supernode_node_config,
    write_credentials,
)

REPO = Path(__file__).resolve().parents[2]
NUM_NODES = 2
ROUNDS = 2
CONNECTION = "privfed-test"

# Run-config overrides (Flower refuses keys that ``[tool.flwr.app.config]``
# does not declare): the federation's shape, then sizes that keep it fast.
REQUIRED_OVERRIDES: dict[str, Any] = {
    "dataset": "shapes:120",
    "num-clients": NUM_NODES,
    "participation": 1.0,
    "rounds": ROUNDS,
    "local-epochs": 1,
    "secagg": True,
}
SHRINKING_OVERRIDES: dict[str, Any] = {
    "batch-size": 16,
    "memory-size": 16,
    "num-local-centroids": 4,
    "num-global-centroids": 8,
    "projection-dim": 16,
    "eval-every": 2,
}

STARTUP_TIMEOUT = 60.0  # seconds for the SuperLink to listen and the SuperNodes to come online
RUN_TIMEOUT = 480.0  # seconds for the whole federated run (about 1-3 minutes on 2 cores)


def _executable(name: str) -> str:
    """Flower's console script from the interpreter running the tests (not some other install)."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"{name} not found next to {sys.executable} nor on PATH; is flwr installed in this environment?")


def _free_ports(count: int) -> list[int]:
    """Ports nobody listens on right now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)


def _proc_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (guards against signalling a recycled pid); None once it is gone.

    A zombie counts as gone: it has exited and only waits for its parent
    to collect its status.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in {"Z", "X"} else int(fields[19])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _copy_with_timestamps(stream: IO[bytes], log: Path) -> None:
    """Write a process's output to ``log`` line by line, each line prefixed with the time.

    Flower's own log lines carry no time; with it, a slow or stuck stage of
    the protocol can be read off the logs of a failed run.
    """
    with open(log, "w", encoding="utf-8") as handle:
        for raw in iter(stream.readline, b""):
            stamp = time.strftime("%H:%M:%S")
            handle.write(f"{stamp} {raw.decode(errors='replace').rstrip()}\n")
            handle.flush()


class Processes:
    """The SuperLink, the SuperNodes and everything they spawn, with their logs.

    Flower starts its executors in new sessions (``start_new_session``), so
    killing our process groups alone would orphan them: descendants are
    tracked through ``/proc`` and signalled by pid, each checked against its
    recorded start time.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.known: dict[int, int | None] = {}  # pid -> start time
        self.copiers: dict[str, threading.Thread] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.directory / f"{name}.log"
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=self.directory, start_new_session=True,
        )
        self.started[name] = proc
        self.logs[name] = log
        self.known[proc.pid] = _proc_start_time(proc.pid)
        copier = threading.Thread(target=_copy_with_timestamps, args=(proc.stdout, log), daemon=True)
        copier.start()
        self.copiers[name] = copier
        return proc

    def final_log(self, name: str) -> str:
        """The whole log of a process that has exited (once its output is fully copied)."""
        self.copiers[name].join(timeout=10)
        return self.logs[name].read_text(errors="replace")

    def remember_descendants(self) -> None:
        if not Path("/proc/self/stat").exists():
            return
        children = _children_map()
        stack = self._alive()  # a dead pid may have been reused: do not adopt its children
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in self.known:
                    self.known[child] = _proc_start_time(child)
                    stack.append(child)

    def _alive(self) -> list[int]:
        return [pid for pid, start in self.known.items() if start is not None and _proc_start_time(pid) == start]

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _signal_groups(self, sig: signal.Signals) -> None:
        """Signal the process groups we created, while their leaders are ours (not reaped)."""
        for proc in self.started.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop_all(self) -> None:
        """SIGTERM everything (Flower shuts down cleanly on it), then SIGKILL what is left."""
        self.remember_descendants()
        self._signal_groups(signal.SIGTERM)
        self._signal(self._alive(), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self.remember_descendants()
            for proc in self.started.values():
                proc.poll()  # reap our direct children
            if not self._alive():
                break
            time.sleep(0.3)
        self._signal_groups(signal.SIGKILL)
        self._signal(self._alive(), signal.SIGKILL)
        for proc in self.started.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def died(self) -> list[str]:
        return [name for name, proc in self.started.items() if proc.poll() is not None]

    def report(self, tail: int = 6000) -> str:
        parts = []
        for name, log in self.logs.items():
            code = self.started[name].poll()
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            parts.append(f"===== {name} (exit code {code}) =====\n{text[-tail:]}")
        return "\n".join(parts)


class Deployment:
    """A running federation and the ``flwr`` CLI configured for it."""

    def __init__(self, tmp_path: Path, processes: Processes) -> None:
        self.tmp_path = tmp_path
        self.processes = processes
        self.port, *self.node_ports = _free_ports(1 + NUM_NODES + 1)
        self.credentials: CredentialPaths = write_credentials(
            generate_credentials(NUM_NODES), tmp_path / "certs"
        )
        base = {
            **os.environ,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # use this environment, no `uv sync`
            "FLWR_DISABLE_UPDATE_CHECK": "1",  # no network on CI
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",  # start each ClientApp sooner than the 1 s default
            "PYTHONUNBUFFERED": "1",
        }
        # One FLWR_HOME per "machine": each installs the app bundle itself.
        self.envs = {
            name: {**base, "FLWR_HOME": str(tmp_path / "home" / name)}
            for name in ["superlink", "cli", "intruder", *(f"supernode-{i}" for i in range(NUM_NODES))]
        }
        for env in self.envs.values():
            Path(env["FLWR_HOME"]).mkdir(parents=True)
        self.address = f"127.0.0.1:{self.port}"
        Path(self.envs["cli"]["FLWR_HOME"], "config.toml").write_text(
            "[superlink]\n"
            f'default = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "{self.address}"\n'
            f'root-certificates = "{self.credentials.ca_certificate}"\n'
        )

    def fail(self, message: str) -> None:
        pytest.fail(f"{message}\n{self.processes.report()}", pytrace=False)

    def wait_for(self, what: str, timeout: float, check: Callable[[], Any], interval: float = 1.0) -> Any:
        """Poll ``check`` until it returns something truthy; fail with all logs otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            dead = [name for name in self.processes.died() if name != "intruder"]
            if dead:
                self.fail(f"{', '.join(dead)} exited while waiting for {what}")
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                [_executable("flwr"), *args], cwd=REPO, env=self.envs["cli"],
                capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as err:
            self.fail(f"`flwr {' '.join(args)}` did not return within {timeout:.0f}s; output: {err.stdout!r} {err.stderr!r}")
            raise  # unreachable: pytest.fail raises

    def flwr_json(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        result = self.flwr(*args, "--format", "json", timeout=timeout)
        start = result.stdout.find("{")
        try:
            reply = json.loads(result.stdout[start:]) if start >= 0 else None
        except json.JSONDecodeError:
            reply = None
        if not isinstance(reply, dict):
            self.fail(f"`flwr {' '.join(args)}` printed no JSON:\n{result.stdout}\n{result.stderr}")
        return reply

    def start_superlink(self) -> None:
        c = self.credentials
        self.processes.start("superlink", [
            _executable("flower-superlink"),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--ssl-ca-certfile", str(c.ca_certificate),
            "--ssl-certfile", str(c.superlink_certificate),
            "--ssl-keyfile", str(c.superlink_key),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--database", str(self.tmp_path / "superlink-state.db"),
        ], self.envs["superlink"])

        def accepts_connections() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return False
            return True

        self.wait_for(f"the SuperLink to listen on port {self.port}", STARTUP_TIMEOUT, accepts_connections, 0.3)

    def start_supernode(self, name: str, key: Path, partition_id: int, runtime_port: int) -> subprocess.Popen:
        """A SuperNode authenticating with ``key``, which is also its SecAgg+ identity; it pins the federation's
        SuperNodes (``privfed certs``' ``supernode-peers.pub``)."""
        peers = self.credentials.supernode_peers
        assert peers is not None
        node_config = f"partition-id={partition_id} num-partitions={NUM_NODES} {supernode_node_config(key, peers)}"
        return self.processes.start(name, [
            _executable("flower-supernode"),
            "--superlink", self.address,
            "--root-certificates", str(self.credentials.ca_certificate),
            "--auth-supernode-private-key", str(key),
            "--node-config", node_config,
            "--port", str(runtime_port),
        ], self.envs[name])


@pytest.fixture
def deployment(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    processes = Processes(tmp_path)
    request.addfinalizer(processes.stop_all)
    yield Deployment(tmp_path, processes)


def _run_config(out: Path, **mechanism: Any) -> str:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    values = {**REQUIRED_OVERRIDES, **SHRINKING_OVERRIDES, **mechanism, "out": str(out)}
    missing = [key for key in values if key not in declared]
    assert not missing, f"[tool.flwr.app.config] in pyproject.toml must declare {missing} (flwr run refuses undeclared keys)"
    return " ".join(f"{key}={_toml_value(value)}" for key, value in values.items())


def _tls_checks(deployment: Deployment) -> None:
    """The SuperLink speaks TLS with a certificate our CA vouches for, and only that CA."""
    trusting = ssl.create_default_context(cafile=str(deployment.credentials.ca_certificate))
    for host in ("localhost", "127.0.0.1"):
        with (
            socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as raw,
            trusting.wrap_socket(raw, server_hostname=host) as tls,
        ):
            assert tls.version() in {"TLSv1.2", "TLSv1.3"}
    stranger = ssl.create_default_context()  # the system's CAs do not know ours
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        stranger.wrap_socket(raw, server_hostname="localhost")


#: The default mechanism, and ddp-sums, whose shares travel inside SecAgg+'s masked vectors.
MECHANISMS = [{}, {"mechanism": "ddp-sums", "epsilon": 10.0}]


@pytest.mark.slow  # a SuperLink and two SuperNodes over TLS: about 100 s each
@pytest.mark.parametrize("mechanism", MECHANISMS, ids=["kanon", "ddp-sums"])
def test_superlink_and_two_supernodes_train_with_tls_node_auth_and_secagg(
    deployment: Deployment, tmp_path: Path, mechanism: dict[str, Any]
):
    started = time.monotonic()
    out = tmp_path / "run"
    run_config = _run_config(out, **mechanism)

    deployment.start_superlink()
    _tls_checks(deployment)

    # Register both SuperNodes' public keys before they connect.
    registered = []
    for pub in deployment.credentials.supernode_public_keys:
        reply = deployment.flwr_json("supernode", "register", str(pub), CONNECTION)
        if not reply.get("success"):
            deployment.fail(f"registering {pub.name} failed: {reply}")
        registered.append(str(reply["node-id"]))

    # A SuperNode with a key nobody registered must be turned away.
    intruder_key = tmp_path / "intruder"
    intruder_key.write_bytes(supernode_key_pair("intruder")[0])
    intruder_key.chmod(0o600)
    intruder = deployment.start_supernode("intruder", intruder_key, 0, deployment.node_ports[NUM_NODES])
    for i, key in enumerate(deployment.credentials.supernode_keys):
        deployment.start_supernode(f"supernode-{i}", key, i, deployment.node_ports[i])

    def activated() -> bool:  # a SuperNode logs its id once the SuperLink let it in
        logs = [deployment.processes.logs[f"supernode-{i}"] for i in range(NUM_NODES)]
        return all(log.exists() and "SuperNode ID:" in log.read_text() for log in logs)

    deployment.wait_for("both registered SuperNodes to connect", STARTUP_TIMEOUT, activated, 0.5)
    nodes = deployment.flwr_json("supernode", "ls", CONNECTION).get("nodes", [])
    online = sorted(node["node-id"] for node in nodes if node["status"] == "online")
    assert online == sorted(registered), nodes
    try:
        intruder.wait(timeout=STARTUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        deployment.fail("the SuperNode with an unregistered key was not rejected")
    assert intruder.returncode != 0
    assert "Failed to activate SuperNode" in deployment.processes.final_log("intruder")

    # Submit the app and follow its logs until the run ends. `--stream` exits 0
    # even when the run failed, and may return early if the stream breaks:
    # the run's status is what counts.
    submitted = time.monotonic()
    streamed = deployment.flwr("run", str(REPO), CONNECTION, "--run-config", run_config, "--stream", timeout=RUN_TIMEOUT)
    if "Successfully started run" not in streamed.stdout:
        deployment.fail(f"`flwr run` did not start a run:\n{streamed.stdout[-4000:]}\n{streamed.stderr[-4000:]}")

    def finished_runs() -> list[dict[str, Any]]:
        runs = deployment.flwr_json("ls", CONNECTION).get("runs", [])
        return runs if runs and all(r["status"].startswith("finished") for r in runs) else []

    remaining = max(30.0, RUN_TIMEOUT - (time.monotonic() - submitted))
    runs = deployment.wait_for("the run to finish", remaining, finished_runs, 3.0)
    if len(runs) != 1 or runs[0]["status"] != "finished:completed":
        deployment.fail(
            f"the run did not complete: {[(r['run-id'], r['status'], r.get('status-details')) for r in runs]}\n"
            f"===== flwr run --stream =====\n{streamed.stdout[-8000:]}\n{streamed.stderr[-4000:]}"
        )

    # The ServerApp (on the SuperLink's machine) wrote the run directory.
    if not (out / "summary.json").is_file():
        deployment.fail(f"the run completed but wrote no {out / 'summary.json'}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS
    assert 0.0 <= summary["knn_accuracy"] <= 1.0
    assert summary["secure_aggregation"]["enabled"] is True
    assert summary["secure_aggregation"].get("halted_rounds", 0) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))
    for record in records:
        assert record["clients_sampled"] == record["clients_completed"] == NUM_NODES, record
        assert record["client_failures"] == 0, record
    assert records[-1]["knn_accuracy"] is not None

    # Each SuperNode ran its ClientApp in every round, each on its own
    # partition: the privacy ledger names the partition-id of every release.
    for i in range(NUM_NODES):
        log = deployment.processes.logs[f"supernode-{i}"].read_text()
        assert log.count("Start `flwr-clientapp` process") >= ROUNDS + 1, log[-3000:]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    shares = mechanism.get("mechanism") == "ddp-sums"  # round 0 has no secure sum, so no share and no charge
    for round_index in range(ROUNDS + 1):
        clients = sorted(e["client"] for e in ledger if e.get("round") == round_index and "client" in e)
        assert clients == ([] if shares and round_index == 0 else list(range(NUM_NODES))), (round_index, clients)
    if shares:
        assert all(r["clients"] == NUM_NODES and r["moved_centroid_fraction"] > 0 for r in records[1:]), records
        assert "sees only the secure sum" in summary["privacy"]["statement"]

    print(f"deployment test: {time.monotonic() - started:.0f}s in total", file=sys.stderr)
