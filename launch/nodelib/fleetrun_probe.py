"""``fab doctor``'s probe: one run per node, facts about the node as one line of JSON.

Sent on stdin to the host's Python (``python - MODE PRIVATE_ADDRESS PORT HEAD LIB_DIR``), so
nothing needs to be installed and the interpreter probed is the one the job will use. Standard
library only (Python 3.8+), plus ``ip``, ``ss`` and ``nvidia-smi`` when the node has them: a
missing tool is a fact to report (``null``), never a crash. Every external command has a short
timeout, so one odd node cannot stall the doctor.

GPU health (ECC, Xid, PCIe, NVLink, throttling, fabric) is read by ``fleetrun_gpu`` (the same
reader the node agent polls during a run) and reported under ``gpu_health``; the cheap mode skips
its slower reads (``nvidia-smi -q``, NVLink). The GPU reads start first, in threads of their own,
and wait on ``nvidia-smi`` while the rest of the facts are gathered; the GPU list of the full
mode is the reader's (one ``--query-gpu`` per probe).

It only reports facts; the verdicts are made on the laptop (``launch.rules.preflight``) from the
answer, which is parsed as untrusted input there (``launch.rules.probe_facts``). ``MODE`` is
``cheap`` (what ``fab train`` checks before every launch) or ``full``; the clock reading is the
last thing taken, just before the answer is written, so the laptop can bound the skew.
"""

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time

try:  # sent ahead of this file by the doctor (``launch.run.doctor.probe_source``), or beside it
    import fleetrun_gpu
except ImportError:
    fleetrun_gpu = None

TOOL_TIMEOUT_S = 8
MAX_ITEMS = 64
LIB_UNHASHED = ("VERSION", "__pycache__")
"""Not part of the library's digest: the laptop's note of its version, and Python's byte-code cache."""
MAX_LIB_FILES = 256
MAX_LIB_BYTES = 32 << 20


def library_digest(directory):
    """The node library's version, from its content: sha256 over the name and bytes of each file,
    in name order (the first 16 hex digits); ``""`` when the directory is missing, holds anything
    but regular files (a link, a directory), too much, or cannot be read.

    The laptop computes the same over the library it ships (``launch.transport.sync``), so a node
    is "current" only when its files are those bytes: a library changed on the node (by a relay,
    a job, a colleague) is replaced by the next sync, whatever a ``VERSION`` file there says."""
    try:
        names = sorted(n for n in os.listdir(directory) if n not in LIB_UNHASHED)
    except OSError:
        return ""
    if len(names) > MAX_LIB_FILES:
        return ""
    digest = hashlib.sha256()
    total = 0
    for name in names:
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return ""
            data = handle.read(MAX_LIB_BYTES - total + 1)
        total += len(data)
        if total > MAX_LIB_BYTES:
            return ""
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def tool(argv, timeout=TOOL_TIMEOUT_S):
    """stdout of ``argv``, or None when the tool is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout[: 256 * 1024].decode("utf-8", "replace")


def user_of(pid):
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def hostname_addresses(name):
    """Addresses ``name`` resolves to here (a bounded wait: a dead resolver must not stall us)."""
    found = []

    def resolve():
        try:
            for info in socket.getaddrinfo(name, None):
                address = info[4][0]
                if address not in found:
                    found.append(address)
        except (OSError, UnicodeError):
            pass

    worker = threading.Thread(target=resolve, daemon=True)
    worker.start()
    worker.join(3.0)
    return found[:MAX_ITEMS]


def interface_of(address):
    """(name, mtu) of the interface holding ``address``, from ``ip -o addr``."""
    out = tool(["ip", "-o", "addr", "show"])
    if out is None or not address:
        return None, None
    for line in out.splitlines():
        fields = line.split()
        for i, field in enumerate(fields[:-1]):
            if field in ("inet", "inet6") and fields[i + 1].split("/")[0] == address:
                name = fields[1].rstrip(":").split("@")[0]
                try:
                    with open(f"/sys/class/net/{name}/mtu") as handle:
                        return name, int(handle.read().strip())
                except (OSError, ValueError):
                    return name, None
    return None, None


def port_facts(port):
    """Is ``port`` free to listen on here, and which processes hold it (``ss -ltnp``)?"""
    in_use = False
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as torch's TCPStore does: connections of an earlier run (or of the doctor's own port test)
    # in TIME_WAIT do not make the port busy; a listener does
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", port))
    except OSError:
        in_use = True
    finally:
        probe.close()
    holders = []
    out = tool(["ss", "-Hltnp", f"sport = :{port}"])
    if out is not None:
        for line in out.splitlines():
            if not line.strip():
                continue
            in_use = True
            for name, pid in re.findall(r'\("([^"]{0,64})",pid=([0-9]{1,10}),', line):
                if len(holders) < MAX_ITEMS:
                    holders.append({"process": name, "pid": int(pid), "user": user_of(int(pid))})
    return {"in_use": in_use, "holders": holders}


def torch_facts():
    """torch's version, its CUDA and NCCL, read from package metadata: importing torch takes
    seconds per node, and 64 nodes of a shared machine doing it at once is the doctor's budget."""
    facts = {"torch": None, "torch_cuda": None, "nccl": None}
    try:
        from importlib import metadata
        from importlib.util import find_spec
    except ImportError:
        return facts
    try:
        facts["torch"] = metadata.version("torch")
    except Exception:
        return facts
    try:
        spec = find_spec("torch")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            with open(os.path.join(folder, "version.py")) as handle:
                match = re.search(r"^cuda(?::[^=]*)?\s*=\s*'([^']{1,32})'", handle.read(65536), re.M)
            facts["torch_cuda"] = match.group(1) if match else None
            break
    except Exception:
        pass
    for dist in ("nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13"):
        try:
            facts["nccl"] = metadata.version(dist)
            break
        except Exception:
            continue
    return facts


def gpu_processes():
    """The compute processes on the GPUs: through NVML first (``fleetrun_gpu.nvml_processes``),
    else ``nvidia-smi --query-compute-apps``; None when the node has neither reader (no GPUs). A
    node with NVML and no nvidia-smi binary (a minimal image, a container with the driver's
    library mounted) is a node with GPUs, as the health reader says (``reader_available``)."""
    if fleetrun_gpu is not None:
        via_nvml = fleetrun_gpu.nvml_processes()
        if via_nvml is not None:
            return [{**p, "user": user_of(p["pid"])} for p in via_nvml[:MAX_ITEMS]]
    smi = "nvidia-smi"
    if shutil.which(smi) is None:
        return None
    procs = []
    query = "--query-compute-apps=gpu_uuid,pid,used_memory"
    out = tool([smi, query, "--format=csv,noheader,nounits"]) or ""
    for line in out.splitlines()[:MAX_ITEMS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1].isdigit():
            memory = int(parts[2]) if parts[2].isdigit() else None
            pid = int(parts[1][:10])
            procs.append({"gpu": parts[0][:128], "pid": pid, "user": user_of(pid), "mem_mib": memory})
    return procs


def gpu_facts(health, procs):
    """GPUs and the compute processes on them; no GPU reader (NVML or ``nvidia-smi``) means no GPUs,
    not an error (``nvidia_smi`` in the answer: the node has a reader, whichever it is).

    The GPUs are those the health reader listed: ``nvidia-smi --query-gpu`` opens every GPU, so
    the probe asks it once. Only without the reader's answer (not sent, or it failed) are they
    asked here."""
    if procs is None:
        return {"nvidia_smi": False, "driver": None, "gpus": [], "gpu_procs": []}
    gpus = []
    driver = None
    if isinstance(health, dict) and "queried" in health and "error" not in health:
        for gpu in health.get("gpus", [])[:MAX_ITEMS]:
            gpus.append({"index": gpu["index"], "uuid": gpu["uuid"][:128]})
        driver = health.get("driver")
        driver = driver[:32] if driver else None
    else:
        query = "--query-gpu=index,uuid,driver_version"
        out = tool(["nvidia-smi", query, "--format=csv,noheader,nounits"]) or ""
        for line in out.splitlines()[:MAX_ITEMS]:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                gpus.append({"index": int(parts[0]), "uuid": parts[1][:128]})
                driver = parts[2][:32]
    return {"nvidia_smi": True, "driver": driver, "gpus": gpus, "gpu_procs": procs}


def started(read, *args):
    """``read(*args)`` begun now in its own thread; the returned function waits for its answer
    (None when it raised). The GPU reads wait on ``nvidia-smi`` while the rest of the probe runs."""
    box = []

    def run():
        box.append(read(*args))

    thread = threading.Thread(target=run, name="fleetrun-probe", daemon=True)
    thread.start()

    def answer():
        thread.join()
        return box[0] if box else None

    return answer


def gpu_health(full):
    """The GPU health reader's answer; an error in it is reported, never the end of the probe."""
    if fleetrun_gpu is None:
        return None
    try:
        return fleetrun_gpu.read_health(full)
    except Exception as exc:  # noqa: BLE001 - the other facts must still reach the laptop
        return {"smi": True, "queried": False, "error": f"{type(exc).__name__}: {exc}"[:200]}


CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")
"""``container.runtime: auto`` takes the first of these the node has (``launch.planning.image_pull``
says the same: the pull and the launch must agree)."""
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
SINGLE_IMAGE = "Treating single images as manifest lists is not implemented"
"""Podman 4's ``manifest inspect`` of a plain image: the registry answered with its manifest."""


def run_status(argv, timeout=TOOL_TIMEOUT_S):
    """(exit code, stderr tail) of ``argv``; (None, why) when it cannot run or hangs."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found"
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer in {timeout} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)[:200]
    return proc.returncode, proc.stderr[-2000:].decode("utf-8", "replace")


def cdi_gpu_specs():
    """CDI spec files that name ``nvidia.com/gpu`` (what ``--device nvidia.com/gpu=all`` needs)."""
    found = []
    for folder in CDI_DIRS:
        try:
            names = sorted(os.listdir(folder))[:MAX_ITEMS]
        except OSError:
            continue
        for name in names:
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(os.path.join(folder, name), "rb") as handle:
                    text = handle.read(1 << 20).decode("utf-8", "replace")
            except OSError:
                continue
            if "nvidia.com" in text and "gpu" in text:
                found.append(os.path.join(folder, name)[:256])
    return found


def image_facts(runtime, image, sif):
    """Is ``image`` on this node, and if not, does its registry have it (without pulling it)?"""
    if runtime == "podman":
        rc, _ = run_status(["podman", "image", "exists", image])
    elif runtime == "docker":
        rc, _ = run_status(["docker", "image", "inspect", image])
    else:
        rc = 0 if os.path.isfile(os.path.expanduser(sif)) and os.path.getsize(os.path.expanduser(sif)) else 1
    if rc == 0:
        return {"present": True, "pullable": None, "error": None}
    if runtime == "podman":
        rc, err = run_status(["podman", "manifest", "inspect", image], timeout=20)
        if rc != 0 and SINGLE_IMAGE in err:
            rc = 0
    elif runtime == "docker":
        rc, err = run_status(["docker", "manifest", "inspect", image], timeout=20)
    else:  # Apptainer cannot ask a registry without pulling: fab train's pull says
        return {"present": False, "pullable": None, "error": None}
    if rc == 0:
        return {"present": False, "pullable": True, "error": None}
    return {"present": False, "pullable": False, "error": err.strip()[-1000:] or f"exit {rc}"}


def container_facts(wanted, image, sif, full):
    """The container runtimes here, which one ``wanted`` (auto or a name) gets, its GPU hook
    and, in the full mode, the image."""
    found = {r: shutil.which(r) is not None for r in CONTAINER_RUNTIMES}
    order = CONTAINER_RUNTIMES if wanted == "auto" else (wanted,)
    chosen = next((r for r in order if found.get(r)), None)
    facts = {"wanted": wanted[:16], "found": [r for r in CONTAINER_RUNTIMES if found[r]], "runtime": chosen}
    if chosen is None or not full:
        return facts
    version = tool([chosen, "--version"]) or ""
    facts["version"] = version.strip().splitlines()[0][:80] if version.strip() else None
    facts["nvidia_ctk"] = shutil.which("nvidia-ctk") is not None
    facts["nvidia_container_cli"] = shutil.which("nvidia-container-cli") is not None
    facts["cdi_gpu"] = cdi_gpu_specs()
    if image:
        facts["image"] = image_facts(chosen, image, sif)
    return facts


def main(argv):
    mode, private, port, head, lib_dir = argv[1], argv[2], int(argv[3]), argv[4] == "1", argv[5]
    container = argv[6:9] if len(argv) >= 9 else None  # RUNTIME IMAGE SIF, with container:
    health = started(gpu_health, mode == "full")
    procs = started(gpu_processes) if mode == "full" else None
    answer = {"v": 1, "mode": mode, "python": platform.python_version()}
    answer["hostname"] = socket.gethostname()[:255]
    answer["hostname_addrs"] = hostname_addresses(answer["hostname"])
    answer["rsync"] = shutil.which("rsync") is not None
    home = os.path.expanduser("~")
    try:
        answer["home_free"] = shutil.disk_usage(home).free
    except OSError:
        answer["home_free"] = None
    answer["lib"] = library_digest(os.path.join(home, lib_dir))
    if head and port > 0:  # 0: the run takes a free port at launch (rdzv_port: auto)
        answer["port"] = port_facts(port)
    if mode == "full":
        answer["iface"], answer["mtu"] = interface_of(private)
        answer.update(torch_facts())
    if container is not None:
        answer["container"] = container_facts(container[0], container[1], container[2], mode == "full")
    answer["gpu_health"] = health()
    if procs is not None:
        answer.update(gpu_facts(answer["gpu_health"], procs()))
    answer["time"] = time.time()
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
