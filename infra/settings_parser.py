"""Reading a raw stack config into ``FleetSettings``, one key at a time, collecting every problem.

Split from ``infra.settings`` (the model, the keys and their limits) so each module stays small.
Pure: no Pulumi import. Each reader names its key in the problem it reports, and parsing goes on
after a problem, so a user sees every bad key of a config at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any

from fleetrun_contract.cluster import cluster_id_for
from fleetrun_contract.keys import PUBLIC_KEY_RE
from fleetrun_contract.lifetime import WARM_UNTIL_FORMAT, parse_warm_until
from infra.clouds.rules import (
    CloudRules,
    MachineRequest,
    MachineSpec,
    Problem,
    Provisioning,
    known_clouds,
    rules_for,
)
from infra.presets import PRESETS, describe_presets
from infra.settings import (
    DEFAULT_DISK_GB,
    DEFAULT_NETWORK_CIDR,
    DOCUMENTATION_RANGES,
    KEYS,
    MAX_DISK_GB,
    MAX_NODES,
    MIN_DISK_GB,
    NAMESPACE,
    WORLD_PREFIX_LIMIT,
    ConfigError,
    FleetSettings,
)


class SettingsParser:
    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.explicit = {k: v for k, v in raw.items() if v is not None and v != ""}
        self.values: dict[str, Any] = dict(self.explicit)
        self.problems: list[Problem] = []

    # -- value coercion ---------------------------------------------------------------------

    def problem(self, key: str, message: str) -> None:
        self.problems.append((key, message))

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.values.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            self.problem(key, f"expected text, got {value!r}")
            return None
        return value.strip() or default

    def integer(self, key: str, default: int | None = None) -> int | None:
        value = self.values.get(key, default)
        if value is None or isinstance(value, bool):
            if isinstance(value, bool):
                self.problem(key, f"expected a whole number, got {value!r}")
            return None
        if isinstance(value, int):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            self.problem(key, f"expected a whole number, got {value!r}")
            return None

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.values.get(key, default)
        if isinstance(value, bool):
            return value
        lowered = str(value).strip().lower()
        if lowered in ("true", "yes", "1"):
            return True
        if lowered in ("false", "no", "0"):
            return False
        self.problem(key, f"expected true or false, got {value!r}")
        return default

    def structured(self, key: str) -> Any:
        value = self.values.get(key)
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                self.problem(key, f"not valid JSON/YAML structure: {exc}")
                return None
        return value

    def str_list(self, key: str, what: str = "a CIDR or a list of CIDRs") -> list[str] | None:
        value = self.structured(key)
        if value is None:
            return None
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v.strip() for v in value]
        self.problem(key, f"expected {what}, got {value!r}")
        return None

    def str_map(self, key: str) -> dict[str, str]:
        value = self.structured(key)
        if value is None:
            return {}
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: str(v) for k, v in value.items()}
        self.problem(key, f"expected a mapping of names to values, got {value!r}")
        return {}

    # -- the parse --------------------------------------------------------------------------

    def parse(self, *, project: str, stack: str) -> FleetSettings:
        self.check_unknown_keys()
        cloud = self.text("cloud")
        if cloud is None:
            self.problem("cloud", f"required: one of {', '.join(known_clouds())}")
        elif cloud not in known_clouds():
            self.problem("cloud", f"{cloud!r} is not supported; one of {', '.join(known_clouds())}")
        if cloud is None or cloud not in known_clouds():
            raise ConfigError(self.problems)
        rules = rules_for(cloud)
        self.apply_preset(cloud)
        self.check_cloud_only_keys(rules)
        allow_unlisted = self.boolean("allow_unlisted")

        zones = self.str_list("zones", what="a zone or a list of zones") or []
        explicit_zone = self.text("zone")
        if explicit_zone and zones and explicit_zone not in zones:
            self.problem("zone", f"{explicit_zone!r} is not one of fleet:zones {zones}")
        location = rules.location(
            self.text("region"), explicit_zone or (zones[0] if zones else None), allow_unlisted
        )
        location = self.collect(location)
        if zones:
            for key, message in rules.failover_zones(
                location.region if location else None, zones, allow_unlisted
            ):
                self.problem(key, message)
        gcp_project = self.text("project")
        project_problem = rules.project_problem(gcp_project)
        if project_problem:
            self.problem("project", project_problem)

        node_count = self.integer("node_count")
        if node_count is None and "node_count" not in self.values:
            self.problem("node_count", "required: how many nodes (or set fleet:preset)")
        elif node_count is not None and not 1 <= node_count <= MAX_NODES:
            self.problem("node_count", f"must be between 1 and {MAX_NODES}, got {node_count}")
            node_count = None

        machine = self.machine(rules, allow_unlisted)
        spot = self.boolean("spot")
        reservation = self.reservation(rules, spot)
        capacity_block = self.boolean("capacity_block")
        placement_group = self.text("placement_group")
        disk_size = self.disk_size()
        image = self.collect(rules.image(self.text("image", "auto") or "auto"))
        ssh_cidrs = self.ssh_cidrs()
        ssh_user = self.ssh_user(rules)
        ssh_public_key = self.ssh_public_key()
        bucket_name, bucket_existing = self.bucket(rules)
        tags = self.str_map("tags")
        for key, message in rules.tag_problems(tags):
            self.problem(key, message)
        efa = self.efa(machine)
        placement = self.placement(machine, reservation, placement_group)
        network_cidr = self.network_cidr(node_count, addresses_per_node(machine, efa))
        warm_until = self.warm_until()
        if machine and image and node_count:
            combination = Provisioning(
                machine=machine,
                image=image,
                node_count=node_count,
                spot=spot,
                reservation=reservation,
                capacity_block=capacity_block,
                zone=explicit_zone,
                zones=tuple(zones),
                placement=placement,
                placement_group=placement_group,
            )
            for key, message in rules.combination_problems(combination):
                self.problem(key, message)

        if self.problems:
            raise ConfigError(self.problems)
        assert location and node_count and machine and image and ssh_cidrs and ssh_user and network_cidr
        return FleetSettings(
            cloud=cloud,
            cluster_id=cluster_id_for(project, stack),
            location=location,
            node_count=node_count,
            machine=machine,
            image=image,
            ssh_cidrs=tuple(ssh_cidrs),
            ssh_user=ssh_user,
            disk_size_gb=disk_size or DEFAULT_DISK_GB,
            disk_type=machine.boot_disk_type or rules.default_disk_type,
            spot=spot,
            reservation=reservation,
            capacity_block=capacity_block,
            zones=tuple(zones),
            bucket_region=rules.region_of(zones[0]) if zones else location.region,
            placement_group=placement_group,
            gcp_project=gcp_project,
            ssh_public_key=ssh_public_key,
            bucket_name=bucket_name,
            bucket_existing=bucket_existing,
            tags=tags,
            efa=efa,
            placement=placement,
            network_cidr=network_cidr,
            preset=self.text("preset"),
            warm_until=warm_until,
        )

    def collect(self, result: Any) -> Any:
        """A rules result: the value, or None after recording its problems."""
        if isinstance(result, list):
            for key, message in result:
                self.problem(key, message)
            return None
        return result

    def check_unknown_keys(self) -> None:
        for key in self.explicit:
            if key not in KEYS:
                close = difflib.get_close_matches(key, list(KEYS), n=1)
                hint = (
                    f"; did you mean {NAMESPACE}:{close[0]}?" if close else f"; known keys: {', '.join(KEYS)}"
                )
                self.problem(key, "unknown key" + hint)

    def apply_preset(self, cloud: str) -> None:
        name = self.text("preset")
        if name is None:
            return
        preset = PRESETS.get(name)
        if preset is None:
            self.problem("preset", f"{name!r} is not a preset; one of: {describe_presets()}")
            return
        values = preset.values_for(cloud)
        if values is None:
            self.problem("preset", f"{name!r} has no {cloud} variant")
            return
        self.values = {**values, **self.explicit}

    def check_cloud_only_keys(self, rules: CloudRules) -> None:
        for other in known_clouds():
            if other == rules.name:
                continue
            other_rules = rules_for(other)
            for key in sorted(other_rules.only_keys - rules.only_keys):
                if key in self.explicit:
                    self.problem(
                        key, f"only used on {other_rules.display_name}; remove it for {rules.display_name}"
                    )
                    self.values.pop(key, None)

    def machine(self, rules: CloudRules, allow_unlisted: bool) -> MachineSpec | None:
        machine_type = self.text("machine_type")
        if machine_type is None:
            self.problem("machine_type", "required: the instance / machine type (or set fleet:preset)")
            return None
        gpus = self.integer("gpus_per_node")
        if gpus is not None and gpus < 0:
            self.problem("gpus_per_node", f"must be 0 or more, got {gpus}")
            return None
        request = MachineRequest(machine_type, gpus, self.text("accelerator_type"), allow_unlisted)
        spec: MachineSpec | None = self.collect(rules.machine(request))
        return spec

    def reservation(self, rules: CloudRules, spot: bool) -> str | None:
        reservation = self.text("reservation")
        if reservation is None:
            return None
        if spot:
            self.problem(
                "reservation",
                "spot capacity cannot be drawn from a reservation; set fleet:spot: false or remove fleet:reservation",
            )
        problem = rules.reservation_problem(reservation)
        if problem:
            self.problem("reservation", problem)
        return reservation

    def disk_size(self) -> int | None:
        size = self.integer("disk_size_gb", DEFAULT_DISK_GB)
        if size is None:
            return None
        if size <= 0:
            self.problem(
                "disk_size_gb", f"must be a positive size in GB (at least {MIN_DISK_GB}), got {size}"
            )
        elif not MIN_DISK_GB <= size <= MAX_DISK_GB:
            self.problem("disk_size_gb", f"must be between {MIN_DISK_GB} and {MAX_DISK_GB} GB, got {size}")
        return size

    def ssh_cidrs(self) -> list[str] | None:
        cidrs = self.str_list("ssh_cidr")
        if not cidrs:
            if "ssh_cidr" not in self.values or cidrs == []:
                self.problem(
                    "ssh_cidr",
                    "required: the address SSH is allowed from, i.e. your address + /32 "
                    "(your address: curl -s https://checkip.amazonaws.com)",
                )
            return None
        allow_world = self.boolean("allow_ssh_from_anywhere")
        good: list[str] = []
        for text in cidrs:
            try:
                net = ipaddress.ip_network(text if "/" in text else text + "/32", strict=True)
            except ValueError as exc:
                self.problem("ssh_cidr", f"{text!r} is not a CIDR such as 81.2.69.142/32 ({exc})")
                continue
            if not isinstance(net, ipaddress.IPv4Network):
                self.problem("ssh_cidr", f"{text!r}: the cluster network is IPv4 only; give an IPv4 CIDR")
                continue
            if any(net.subnet_of(doc) for doc in DOCUMENTATION_RANGES):
                self.problem(
                    "ssh_cidr",
                    f"{text} is a documentation example address, not yours; set your own "
                    "(curl -s https://checkip.amazonaws.com, then add /32)",
                )
                continue
            if net.prefixlen < WORLD_PREFIX_LIMIT and not allow_world:
                self.problem(
                    "ssh_cidr",
                    f"{text} opens SSH to the whole internet; give your own address (your IP + /32) "
                    "or set fleet:allow_ssh_from_anywhere: true if you really mean it",
                )
                continue
            good.append(str(net))
        return good or None

    def ssh_user(self, rules: CloudRules) -> str | None:
        user = self.text("ssh_user", rules.default_ssh_user)
        if user is None or not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user) or user == "root":
            self.problem("ssh_user", f"{user!r} is not a valid login name (lowercase, not root)")
            return None
        return user

    def ssh_public_key(self) -> str | None:
        key = self.text("ssh_public_key")
        if key is None:
            return None
        if "PRIVATE KEY" in key:
            self.problem("ssh_public_key", "this is a private key: give the public one (the .pub file)")
            return None
        if not PUBLIC_KEY_RE.fullmatch(key.strip()):
            self.problem(
                "ssh_public_key", "expected an OpenSSH public key such as 'ssh-ed25519 AAAA... you@laptop'"
            )
            return None
        return key

    def bucket(self, rules: CloudRules) -> tuple[str | None, bool]:
        name = self.text("bucket", "auto")
        existing = self.boolean("bucket_existing")
        if name == "auto" or name is None:
            if existing:
                self.problem("bucket_existing", "needs fleet:bucket set to the existing bucket's name")
            return None, False
        problem = rules.bucket_name_problem(name)
        if problem:
            self.problem("bucket", problem)
        return name, existing

    def warm_until(self) -> str | None:
        """``fleet:warm_until`` as the one UTC form both clouds' schedulers are given."""
        value = self.text("warm_until")
        if value is None:
            return None
        try:
            when = parse_warm_until(value)
        except ValueError:
            self.problem("warm_until", f"expected a UTC time like 2026-11-28T21:05:00Z, got {value!r}")
            return None
        return when.strftime(WARM_UNTIL_FORMAT)

    def efa(self, machine: MachineSpec | None) -> bool:
        """EFA wherever the type has it, whatever the node count: a launch template that appears
        when a cluster grows from 1 to 2 nodes would replace node0 (launch_template forces a new
        instance), so node resources never depend on the node count."""
        value = self.values.get("efa", "auto")
        if machine is None:
            return False
        supported = machine.efa_interfaces > 0
        if str(value).strip().lower() == "auto":
            return supported
        wanted = self.boolean("efa")
        if wanted and not supported:
            self.problem(
                "efa", f"{machine.machine_type} has no EFA; set fleet:efa: false or pick a type with EFA"
            )
            return False
        return wanted

    def placement(
        self, machine: MachineSpec | None, reservation: str | None, placement_group: str | None
    ) -> bool:
        """Whether fleetrun creates its own placement group / compact policy.

        Independent of the node count: a group that appears at 2 nodes (or vanishes at 1) would
        replace node0 on both clouds, and deleting a placement group still holding node0 fails.
        Not with a reservation: the reservation's capacity has its own placement (name it with
        fleet:placement_group), and an instance cannot target a reservation from another group.
        """
        explicit = "placement" in self.explicit
        wanted = self.boolean("placement", True)
        if machine is None:
            return False
        if explicit and wanted and not machine.compact_placement:
            self.problem(
                "placement", f"{machine.machine_type} cannot be placed compactly; set fleet:placement: false"
            )
            return False
        if placement_group or reservation:
            return False
        return wanted and machine.compact_placement

    def network_cidr(self, node_count: int | None, per_node: int = 1) -> str | None:
        """The cluster's private range, checked to hold every node's addresses (``per_node``:
        see ``addresses_per_node``); the cloud keeps 5 of each subnet for itself."""
        text = self.text("network_cidr", DEFAULT_NETWORK_CIDR) or DEFAULT_NETWORK_CIDR
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            self.problem("network_cidr", f"{text!r} is not a CIDR ({exc})")
            return None
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 24:
            self.problem("network_cidr", f"{text} must be a private IPv4 range between /16 and /24")
            return None
        if node_count and net.num_addresses - 5 < node_count * per_node:
            each = f" ({per_node} each: one per EFA interface)" if per_node > 1 else ""
            self.problem(
                "network_cidr",
                f"{text} holds {net.num_addresses - 5} addresses; {node_count} nodes need "
                f"{node_count * per_node}{each}; use a larger range (e.g. a /16)",
            )
            return None
        return str(net)


def addresses_per_node(machine: MachineSpec | None, efa: bool) -> int:
    """Addresses a node takes in the cluster subnet: one per network interface there. With EFA,
    the program gives a node one EFA interface per network card (p4d: 4, p5: 32), each with its
    own private address in the subnet; otherwise one. (GCP's extra A3 NICs are on their own data
    subnets, not in this range.)"""
    if machine is None or not efa:
        return 1
    return max(1, machine.efa_interfaces)
