"""Topology models: the fabric's kind (leaf-spine, fat-tree, rail-optimized), its links,
dilation, MTU and port buffers, and the switch names every kind uses."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag, WithJsonSchema, field_validator

from fabric_emu.spec.fields import NAME_HELP, NAME_RE, Bytes, Strict


class LinkSpec(Strict):
    """A class of links (every host link, or every link between switches)."""

    gbps: float = Field(gt=0, le=1600, description="modelled link rate in Gb/s")


MAX_DILATION = 1_000_000


def _dilation(v: Any) -> Any:
    """A number from 1 to MAX_DILATION, or 'auto' (left for fabric_emu.measure.dilation to resolve)."""
    if v == "auto":
        return v
    allowed = f"a number from 1 to {MAX_DILATION:,}, or auto"
    if isinstance(v, bool):
        raise ValueError(f"got {v!r} ({allowed})")
    try:
        d = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"got {v!r} ({allowed})") from None
    if not 1 <= d <= MAX_DILATION:  # also rejects nan
        raise ValueError(f"{v!r} is out of range ({allowed})")
    return d


Dilation = Annotated[Union[float, Literal["auto"]], BeforeValidator(_dilation), WithJsonSchema(
    {"anyOf": [{"type": "number", "minimum": 1, "maximum": MAX_DILATION}, {"const": "auto"}]})]


class TopologyBase(Strict):
    """What every kind of fabric has: links, dilation, MTU and port buffers."""

    name: str = Field(pattern=NAME_RE, description=f"the fabric's name: {NAME_HELP}")
    host_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="every link between a host and its leaf")
    fabric_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="every link between two switches")
    dilation: Dilation = Field(
        default=2000.0, description="emulated = modelled / dilation; 'auto': the lowest that this "
        "machine's measured capacity carries with a margin (fabric_emu.measure.dilation)")
    mtu: int = Field(default=4200, ge=1280, le=9000, description="Ethernet MTU of every link")
    port_buffer: Bytes = Field(default=1_000_000, ge=10_000, le=1_000_000_000,
                               description="egress buffer per switch port, bytes")


TOPOLOGY_KINDS = ("leaf-spine", "fat-tree", "rail-optimized")
UNKNOWN_KIND = f"allowed: {', '.join(TOPOLOGY_KINDS)}"
KIND_HELP = f"the fabric's kind: {', '.join(TOPOLOGY_KINDS)}"


class LeafSpineSpec(TopologyBase):
    """Two tiers: every leaf connects to every spine (the default kind)."""

    kind: Literal["leaf-spine"] = Field(description=KIND_HELP)
    spines: int = Field(ge=1, le=64, description="spine switches (spine1..spineS); every leaf connects to each")
    leaves: int = Field(ge=1, le=200, description="leaf switches (leaf1..leafL)")
    hosts_per_leaf: int = Field(ge=1, le=200, description="hosts under each leaf (h1..hN, numbered leaf by leaf)")

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v: Any) -> Any:
        # Unknown kinds are validated as leaf-spine (so every other problem is reported too);
        # say which kinds exist rather than only this one.
        if v not in TOPOLOGY_KINDS:
            raise ValueError(f"got {v!r} ({UNKNOWN_KIND})")
        return v

    @property
    def host_count(self) -> int:
        return self.leaves * self.hosts_per_leaf


class FatTreeSpec(TopologyBase):
    """A k-ary three-tier fat-tree (Al-Fares et al. 2008): (k/2)^2 core switches; k pods of k/2
    aggregation and k/2 edge switches; k/2 hosts per edge switch, k^3/4 hosts."""

    kind: Literal["fat-tree"] = Field(description=KIND_HELP)
    # At most 12: the port datapath maps up to 4095 link ends (k=12 has 2,592, k=14 4,116).
    k: int = Field(ge=4, le=12, description="switch radix: an even number from 4 to 12")

    @field_validator("k")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"got {v}; k must be even (4, 6, 8, 10, 12)")
        return v

    @property
    def host_count(self) -> int:
        return self.k ** 3 // 4


class RailOptimizedSpec(TopologyBase):
    """Servers with several NICs, in groups: NIC n of every server of a group connects to the
    group's rail leaf n; every rail leaf connects to every spine."""

    kind: Literal["rail-optimized"] = Field(description=KIND_HELP)
    groups: int = Field(ge=1, le=16, description="server groups (each with its own rail leaves)")
    servers_per_group: int = Field(ge=1, le=64, description="servers in each group")
    nics_per_server: int = Field(ge=1, le=8, description="NICs per server = rail leaves per group")
    spines: int = Field(ge=1, le=64, description="spine switches; every rail leaf connects to each")

    @property
    def host_count(self) -> int:
        return self.groups * self.servers_per_group * self.nics_per_server


TopologySpec = LeafSpineSpec  # the default kind's model, under its first name


def _topology_kind(v: Any) -> str:
    """The model to validate a topology with; unknown or missing kinds go to leaf-spine, whose
    kind check names the allowed kinds."""
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind if kind in TOPOLOGY_KINDS else "leaf-spine"


Topology = Annotated[
    Union[Annotated[LeafSpineSpec, Tag("leaf-spine")], Annotated[FatTreeSpec, Tag("fat-tree")],
          Annotated[RailOptimizedSpec, Tag("rail-optimized")]],
    Discriminator(_topology_kind)]


# Switch names of every kind (fabric_emu.topo.plan): spineN, leafN; fat-tree coreN, aggN, edgeN;
# rail-optimized gGrailR (group G's leaf of rail R).
SWITCH_NAME = r"(?:(?:spine|leaf|core|agg|edge)[1-9][0-9]{0,3}|g[1-9][0-9]?rail[1-9])"
SWITCH_PORT_RE = rf"^{SWITCH_NAME}-eth[0-9]{{1,3}}$"
