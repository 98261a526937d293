"""Run the fleet program under Pulumi's mocks: no CLI, no cloud, no credentials.

Used by ``tests/infra`` and ``bench/pulumi_eval.py``. ``run_fleet(settings)`` evaluates the
whole program (``infra.program.build_fleet``) and returns a ``Snapshot``: every registered
resource with its inputs and its resource options, plus the resolved stack outputs.

What mocks can and cannot show (see ../shared/design/pulumi-notes.md): they run the program's
code and every constructor's argument checks, and let tests inspect inputs and options. They do
not run the providers: an invalid enum value, a made-up instance type or a quota is only found
against a real cloud. Resource options (``retain_on_delete``, ``ignore_changes``...) never reach
``Mocks``, so ``RecordingMonitor`` records them from the monitor's ``RegisterResource``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pulumi
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from pulumi.runtime.mocks import MockMonitor

from infra.settings import FleetSettings


@dataclass
class Registered:
    """One resource as the program declared it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    custom: bool = True
    parent: str = ""
    protect: bool = False
    retain_on_delete: bool = False
    delete_before_replace: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    additional_secret_outputs: list[str] = field(default_factory=list)
    secret_inputs: list[str] = field(default_factory=list)
    """Inputs that arrived as Pulumi secrets (kept encrypted in the state)."""


@dataclass
class Snapshot:
    resources: list[Registered]
    outputs: dict[str, Any]
    secret_outputs: set[str] = field(default_factory=set)
    """Top-level stack outputs that are secrets (shown only with --show-secrets)."""
    invokes: list[str] = field(default_factory=list)
    """Tokens of the lookups (invokes) the program made, e.g. aws:ec2/getAmi:getAmi."""

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str) -> Registered:
        found = self.of_type(typ)
        if len(found) != 1:
            raise AssertionError(f"expected one {typ}, found {len(found)}")
        return found[0]

    def counts(self) -> Counter[str]:
        return Counter(r.typ for r in self.resources)

    @property
    def custom_resources(self) -> list[Registered]:
        return [r for r in self.resources if r.custom and not r.typ.startswith("pulumi:providers:")]


SECRET_SIG = "4dabf18193072939515e22adb298388d"
"""The key marking a secret value in deserialized properties (pulumi.runtime.rpc._special_sig_key)."""


def reveal(value: Any) -> Any:
    """``value`` with Pulumi's secret wrappers removed, so tests can read secret inputs."""
    if isinstance(value, dict):
        if SECRET_SIG in value and "value" in value:
            return reveal(value["value"])
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v) for v in value]
    return value


def _digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


@functools.cache
def _ed25519_openssh(name: str) -> tuple[str, str]:
    """A key derived from the resource's name, and the same text every time (OpenSSH's format
    carries a random check word): evaluating the program twice gives an existing key back, as
    the real state does for an existing ``tls.PrivateKey`` (update tests compare inputs)."""
    key = ed25519.Ed25519PrivateKey.from_private_bytes(_digest(name))
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, public + "\n"  # pulumi-tls ends public_key_openssh with a newline


class FleetMocks(pulumi.runtime.Mocks):
    """Synthesises what the clouds would compute: ids, ARNs, addresses, generated keys.

    Ids and keys are derived from resource names (not from registration order), so two
    evaluations of the program (N and N+1 nodes) give an unchanged resource the same inputs.
    """

    IMAGE_SIZE_GB = 100
    """The size both image lookups report (the real deep-learning images are of this order)."""

    def __init__(self, project: str = "my-gcp-project") -> None:
        self.project = project
        self.inputs: dict[tuple[str, str], dict[str, Any]] = {}
        self.outputs: dict[tuple[str, str], dict[str, Any]] = {}
        self.secret_inputs: dict[tuple[str, str], list[str]] = {}
        self.invokes: list[str] = []
        self._serial = itertools.count(1)
        self._lock = threading.Lock()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        with self._lock:
            n = next(self._serial)
        inputs = reveal(dict(args.inputs))
        outputs = dict(inputs)
        rid = f"{args.name}-id"
        typ = args.typ
        if typ == "tls:index/privateKey:PrivateKey":
            private, public = _ed25519_openssh(args.name)
            outputs.update(privateKeyOpenssh=private, publicKeyOpenssh=public, privateKeyPem=private)
        elif typ == "aws:ec2/instance:Instance":
            rid = "i-" + _digest(args.name).hex()[:17]
            outputs.update(
                id=rid,
                arn=f"arn:aws:ec2:us-east-1:123456789012:instance/{rid}",
                primaryNetworkInterfaceId="eni-" + _digest(args.name).hex()[:17],
                privateIp=f"10.0.{n // 250}.{n % 250 + 4}",
                publicIp=f"54.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}",
            )
        elif typ == "aws:ec2/eip:Eip":
            rid = "eipalloc-" + _digest(args.name).hex()[:17]
            outputs.update(
                id=rid, allocationId=rid, publicIp=f"3.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
            )
        elif typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            role_id = inputs.get("roleId") or f"{args.name}_a1b2c3d"
            outputs.update(roleId=role_id, name=f"projects/{self.project}/roles/{role_id}")
        elif typ == "aws:s3/bucket:Bucket":
            rid = inputs.get("bucket") or f"{args.name}-a1b2c3d"
            outputs.update(bucket=rid, arn=f"arn:aws:s3:::{rid}")
        elif typ == "aws:ec2/subnet:Subnet":
            outputs.setdefault("availabilityZone", "us-east-1a")
        elif typ in (
            "aws:iam/role:Role",
            "aws:iam/instanceProfile:InstanceProfile",
            "aws:ec2/placementGroup:PlacementGroup",
        ):
            outputs.setdefault("name", f"{args.name}-a1b2c3d")
            outputs["arn"] = f"arn:aws:iam::123456789012:role/{outputs['name']}"
        elif typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{inputs['accountId']}@{self.project}.iam.gserviceaccount.com"
        elif typ == "gcp:storage/bucket:Bucket":
            rid = inputs.get("name") or f"{args.name}-a1b2c3d"
            outputs.update(name=rid, url=f"gs://{rid}")
        elif typ == "gcp:compute/instance:Instance":
            rid = str(7_000_000_000_000_000_000 + int.from_bytes(_digest(args.name)[:6], "big"))
            interfaces = [dict(i) for i in inputs.get("networkInterfaces", [])]
            if interfaces:
                interfaces[0]["networkIp"] = f"10.0.{n // 250}.{n % 250 + 4}"
                interfaces[0]["accessConfigs"] = [
                    {"natIp": f"34.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"}
                ]
            outputs.update(instanceId=rid, networkInterfaces=interfaces)
        if typ.startswith("gcp:"):
            outputs.setdefault(
                "selfLink", f"https://www.googleapis.com/compute/v1/projects/{self.project}/x/{args.name}"
            )
        secret = [k for k, v in args.inputs.items() if isinstance(v, dict) and SECRET_SIG in v]
        with self._lock:
            self.inputs[(typ, args.name)] = inputs
            self.outputs[(typ, args.name)] = outputs
            self.secret_inputs[(typ, args.name)] = secret
        return rid, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        with self._lock:
            self.invokes.append(args.token)
        return self._answer(args), []

    def _answer(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        token = args.token
        if token == "aws:ec2/getAmi:getAmi":
            pinned = [f["values"][0] for f in args.args.get("filters", []) if f.get("name") == "image-id"]
            ami = pinned[0] if pinned else "ami-0123456789abcdef0"
            return {
                "id": ami,
                "imageId": ami,
                "name": "DLAMI",
                "rootDeviceName": "/dev/sda1",
                "blockDeviceMappings": [
                    {
                        "deviceName": "/dev/sda1",
                        "ebs": {"volume_size": str(self.IMAGE_SIZE_GB)},
                        "noDevice": "",
                        "virtualName": "",
                    },
                    {"deviceName": "/dev/sdb", "ebs": {}, "noDevice": "", "virtualName": "ephemeral0"},
                ],
            }
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            return {"locations": ["us-east-1c", "us-east-1a"], "instanceTypes": [], "locationTypes": []}
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": "123456789012", "arn": "arn:aws:iam::123456789012:user/op", "id": "x"}
        if token == "aws:s3/getBucket:getBucket":
            name = args.args["bucket"]
            return {"id": name, "bucket": name, "arn": f"arn:aws:s3:::{name}"}
        if token == "gcp:compute/getImage:getImage":
            link = f"https://www.googleapis.com/compute/v1/projects/{args.args.get('project')}/global/images/dlvm-1"
            return {"selfLink": link, "name": "dlvm-1", "diskSizeGb": self.IMAGE_SIZE_GB}
        if token == "gcp:storage/getBucket:getBucket":
            return {"name": args.args["name"]}
        return {}


class RecordingMonitor(MockMonitor):
    """The mock monitor, also recording each registration's resource options."""

    def __init__(self, mocks: FleetMocks) -> None:
        super().__init__(mocks)
        self.fleet_mocks = mocks
        self.registered: list[Registered] = []
        self._records_lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        key = (request.type, request.name)
        record = Registered(
            typ=request.type,
            name=request.name,
            inputs=self.fleet_mocks.inputs.get(key, {}),
            outputs=self.fleet_mocks.outputs.get(key, {}),
            custom=bool(request.custom),
            parent=request.parent,
            protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete),
            delete_before_replace=bool(request.deleteBeforeReplace),
            ignore_changes=list(request.ignoreChanges),
            additional_secret_outputs=list(request.additionalSecretOutputs),
            secret_inputs=self.fleet_mocks.secret_inputs.get(key, []),
        )
        with self._records_lock:
            self.registered.append(record)
        return response


def run_fleet(settings: FleetSettings, *, project: str = "fleetrun", stack: str = "test") -> Snapshot:
    """Evaluate the program for ``settings`` under mocks; return what it declared and exported."""
    from infra.program import build_fleet

    mocks = FleetMocks(settings.gcp_project or "my-gcp-project")
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    resolved: dict[str, Any] = {}
    declared: dict[str, Any] = {}
    secret: set[str] = set()

    async def find_secrets() -> bool:
        for key, value in declared.items():
            if isinstance(value, pulumi.Output) and await value.is_secret():
                secret.add(key)
        return True

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        declared.update(build_fleet(settings, export=False))
        secrets_found: pulumi.Output[bool] = pulumi.Output.from_input(asyncio.ensure_future(find_secrets()))
        return pulumi.Output.all(pulumi.Output.from_input(declared).apply(resolved.update), secrets_found)

    program()
    return Snapshot(
        resources=list(monitor.registered),
        outputs=resolved,
        secret_outputs=secret,
        invokes=list(mocks.invokes),
    )
