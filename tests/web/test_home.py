"""The Pod page: the topology picture, the page's data, and the page on a real daemon (this box and a DGX-1)."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from deskpod.hardware.catalog import machine
from deskpod.hardware.summary import describe
from deskpod.hardware.topology import DeviceInfo, Nic, Topology, cpu_topology
from deskpod.hardware.usage import GpuUse, Usage
from deskpod.jobs.store import User
from deskpod.web.home import device_rows, pod_status
from deskpod.web.session import Viewer
from deskpod.web.topology_svg import link_class, link_counts, nic_groups, nvlink_total, render_svg
from tests.jobs.pods import SLEEPER, Pod, Pods, python_job, wait_for, wait_state
from tests.web.browser import launch_chromium, new_user, open_signed_in, sign_in

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    """The picture as XML: it must be well formed (everything escaped) to parse at all."""
    return ET.fromstring(markup)


def groups(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if cls in (g.get("class") or "").split()]


def edges(svg: ET.Element, cls: str) -> list[ET.Element]:
    """Lines of a class that stand for a pair (they carry a <title>; the legend's swatches do not)."""
    return [e for e in svg.iter(f"{SVG}line") if e.get("class") == cls and e.find(f"{SVG}title") is not None]


# ---------------------------------------------------------------------------------------------- the picture
def test_dgx1_is_drawn_with_its_nvlinks_nics_cliques_and_a_legend() -> None:
    topo = machine("dgx1-v100")
    svg = parse(render_svg(topo))
    assert [g.get("data-device") for g in groups(svg, "tp-node")] == [str(i) for i in range(8)]
    info = describe(topo)
    nv_pairs = [(lk["a"], lk["b"]) for lk in info["links"] if lk["kind"] == "nvlink"]
    assert len(edges(svg, "tp-nvlink")) == len(nv_pairs) == 16  # the hybrid cube-mesh: 16 linked pairs
    sys_pairs = [lk for lk in info["links"] if lk["token"] == "SYS"]
    assert len(edges(svg, "tp-sockets")) == len(sys_pairs) == 12
    # An NV2 pair is drawn wider than an NV1 pair.
    widths = {e.find(f"{SVG}title").text.split(":")[1].split()[0]: e.get("style") for e in edges(svg, "tp-nvlink")}  # type: ignore[union-attr]
    assert widths["NV2"] != widths["NV1"]
    nics = [g.get("data-nic") or "" for g in groups(svg, "tp-nic")]
    assert sorted(nics) == sorted(n["name"] for n in info["nics"]) and len(nics) == 4
    # mlx5_0 is wired to the GPUs it is nearest to (PIX: GPU0 and GPU1), and says so.
    mlx0 = next(g for g in groups(svg, "tp-nic") if g.get("data-nic") == "mlx5_0")
    assert "nearest GPU0, GPU1 (PIX)" in (mlx0.findtext(f"{SVG}title") or "")
    nic_lines = [e for e in svg.iter(f"{SVG}line") if e.get("class") == "tp-niclink"]
    assert len(nic_lines) == 4 * 2 + 1  # each NIC to its two nearest GPUs, and the legend's swatch
    bands = [e for e in svg.iter() if e.get("class") == "tp-clique-band" and e.find(f"{SVG}title") is not None]
    assert sorted(b.findtext(f"{SVG}title") or "" for b in bands) == [
        "NVLink clique {0,1,2,3}: NVLink between every pair",
        "NVLink clique {4,5,6,7}: NVLink between every pair",
    ]
    text = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert "NVLink · 16 pairs, 24 links" in text and "across sockets · 12 pairs" in text
    title, desc = svg.find(f"{SVG}title"), svg.find(f"{SVG}desc")
    assert title is not None and desc is not None
    assert svg.get("role") == "img" and svg.get("aria-labelledby") == f"{title.get('id')} {desc.get('id')}"
    assert "GPU0–GPU3 NV2" in (desc.text or "") and "{0,1,2,3}" in (desc.text or "")
    # Colours are the page's CSS variables, so the picture follows light and dark.
    style = svg.findtext(f"{SVG}style") or ""
    assert "var(--fg" in style and "var(--s3" in style and "#" not in re.sub(r"var\([^)]*\)", "", style)


def test_counts_classes_and_nic_groups_follow_the_model() -> None:
    dgx1 = machine("dgx1-v100")
    assert link_counts(dgx1) == {"nvlink": 16, "sockets": 12}
    assert nvlink_total(dgx1) == sum(dgx1.nvlink_degree(i) for i in range(8)) // 2 == 24
    pcie = machine("pcie-8gpu")
    assert set(link_counts(pcie)) == {"pcie", "sockets"}
    assert {link_class(pcie.link(0, 1)), link_class(pcie.link(0, 4))} == {"pcie", "sockets"}
    a100 = machine("dgx-a100")
    wired, far = nic_groups(a100)
    assert {n.name for n in far} == {"mlx5_4", "mlx5_5", "mlx5_10", "mlx5_11"}  # SYS to every GPU: storage ports
    assert ((0, 1), ["mlx5_0", "mlx5_1"]) in [(near, [n.name for n in nics]) for near, nics in wired]


def test_an_nvswitch_box_gets_a_hub_with_a_spoke_per_gpu() -> None:
    topo = machine("dgx-a100")
    svg = parse(render_svg(topo))
    assert len(edges(svg, "tp-nvswitch")) == 8 and not edges(svg, "tp-nvlink")
    hub = groups(svg, "tp-hub")
    assert len(hub) == 1 and "6 NVSwitches" in (hub[0].findtext(f"{SVG}title") or "")
    assert "NICs near no GPU in particular: mlx5_4" in " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))


def test_cpu_slots_share_host_memory_and_held_ones_are_marked() -> None:
    svg = parse(render_svg(cpu_topology(2), held={1: "12"}))
    nodes = groups(svg, "tp-node")
    assert len(nodes) == 2 and len(edges(svg, "tp-shm")) == 2 and not edges(svg, "tp-nvlink")
    assert "held" not in (nodes[0].get("class") or "") and "held" in (nodes[1].get("class") or "")
    states = [t.text for g in nodes for t in g.iter(f"{SVG}text") if "tp-state" in (t.get("class") or "")]
    assert states == ["free", "job 12"]
    many = parse(render_svg(cpu_topology(20)))
    assert len(groups(many, "tp-node")) == 20 and not edges(many, "tp-shm")  # rows: one memory box around them


def test_names_are_escaped() -> None:
    evil = "<script>alert(1)</script>"
    devices = (DeviceInfo(0, "GPU0", model='"><img src=x onerror=alert(1)>'), DeviceInfo(1, "GPU1", model="ok"))
    links = tuple(row[:2] for row in machine("dgx-station").links[:2])  # two GPUs with NV2 between them
    topo = Topology(evil, devices, links, kind="cuda", nics=(Nic("<b>nic</b>", ("PIX", "PIX")),))
    markup = str(render_svg(topo, id_prefix='x"y'))
    assert "<script" not in markup and "<img" not in markup and "<b>" not in markup and 'x"y' not in markup
    svg = parse(markup)  # still well formed
    assert evil in (svg.findtext(f"{SVG}title") or "") and evil in (svg.findtext(f"{SVG}desc") or "")
    assert "&lt;b&gt;nic&lt;/b&gt;" in markup and len(edges(svg, "tp-nvlink")) == 1


# ---------------------------------------------------------------------------------------------- the data
def usage_with(gpus: tuple[GpuUse, ...]) -> Usage:
    return Usage("nvml" if gpus else "proc", gpus, 10.0, (10.0,), 1.0, 1, 2, (0.0, 0.0, 0.0))


def status_of(n: int, holders: dict[int, tuple[str, str, str]]) -> dict[str, Any]:
    devices = []
    for i in range(n):
        job, user, name = holders.get(i, (None, None, None))
        devices.append({"index": i, "kind": "cuda", "job": job, "user": user, "name": name})
    return {"devices": devices, "queued": 0, "running": len(holders)}


def viewer_of(name: str, admin: bool = False) -> Viewer:
    return Viewer(User(name, admin), "", None)


def test_device_rows_show_holders_and_only_the_owners_see_the_job_name() -> None:
    topo = dataclasses.replace(machine("dgx-station"), source="nvml")  # a real 4-GPU box, as NVML found it
    web = SimpleNamespace(pod=SimpleNamespace(topology=topo, device_kind="cuda"))
    gpus = tuple(GpuUse(i, "Tesla V100-DGXS-32GB", 10.0 * i, i * 2**30, 32 * 2**30) for i in range(4))
    status = status_of(4, {2: ("7", "alice", "resnet")})
    for who, sees in ((viewer_of("alice"), True), (viewer_of("root", admin=True), True), (viewer_of("bob"), False)):
        rows = device_rows(web, who, status, usage_with(gpus))
        assert [r.job for r in rows] == [None, None, "7", None]
        assert rows[2].user == "alice"  # who holds a device is the pod's business, like /v1/status
        assert rows[2].job_name == ("resnet" if sees else None) and rows[2].can_open is sees
        assert [r.utilization for r in rows] == [0.0, 10.0, 20.0, 30.0]
        assert rows[3].memory_used == 3 * 2**30 and rows[3].memory_total == 32 * 2**30
        assert rows[0].label == "GPU0" and rows[0].name == "Tesla V100-DGXS-32GB"


def test_a_catalog_machine_gets_no_live_figures_from_this_boxs_gpus() -> None:
    web = SimpleNamespace(pod=SimpleNamespace(topology=machine("dgx1-v100"), device_kind="cuda"))
    gpus = (GpuUse(0, "NVIDIA H200", 50.0, 1, 2),)
    rows = device_rows(web, viewer_of("alice"), status_of(8, {}), usage_with(gpus))
    assert len(rows) == 8 and all(r.utilization is None and r.memory_total is None for r in rows)
    assert rows[0].kind == "cuda" and rows[0].name == "Tesla V100-SXM2-32GB"


def test_pod_status_is_reread_when_the_store_changed_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    store = SimpleNamespace(version=3)
    clock = [100.0]
    monkeypatch.setattr("deskpod.web.home.time.monotonic", lambda: clock[0])

    def status() -> dict[str, Any]:
        calls.append(store.version)
        return status_of(2, {})

    web = SimpleNamespace(store=store, pod=SimpleNamespace(status=status), cache={})
    first = pod_status(web, 1.0)
    clock[0] += 60.0
    assert all(pod_status(web, 1.0) is first for _ in range(50)) and calls == [3]  # unchanged: never re-read
    store.version = 4
    assert pod_status(web, 1.0) is not first and calls == [3, 4]
    for _ in range(50):  # a busy store, 50 polls within the second: no read
        store.version += 1
        clock[0] += 0.01
        pod_status(web, 1.0)
    assert calls == [3, 4]
    pod_status(web)  # a page load sees the store as it is
    assert calls == [3, 4, store.version]


# ---------------------------------------------------------------------------------------------- a real daemon
def test_anonymous_requests_are_sent_to_sign_in(web_pod: Pod) -> None:
    with httpx.Client(base_url=web_pod.url, follow_redirects=False, timeout=30, trust_env=False) as c:
        r = c.get("/ui/")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/"
        for path in ("/ui/pod.json", "/ui/pod/usage.json"):
            r = c.get(path)
            assert r.status_code == 401 and "error" in r.json(), path


def test_every_device_is_free_then_a_running_job_holds_one(web_pod: Pod, admin: httpx.Client, tmp_path: Path) -> None:
    api = web_pod.client()
    n = len(api.status()["devices"])
    twin = admin.get("/ui/pod.json").json()
    assert [d["index"] for d in twin["devices"]] == list(range(n))
    assert all(d["job"] is None for d in twin["devices"]) and twin["counts"]["free"] == n
    assert twin["topology"]["device_count"] == n and twin["topology"]["simulated"] is False
    page = admin.get("/ui/")
    assert page.status_code == 200 and 'src="/ui/static/home.js' in page.text and "<svg" in page.text
    assert page.text.count('class="ok">free<') == n and 'href="/ui/new"' in page.text
    assert 'href="/ui/pod.json"' in page.text  # the footer's JSON twin

    job = api.submit({"name": "holder", "command": python_job(SLEEPER), "workdir": str(tmp_path)})
    try:
        wait_state(api, job["id"], "running")
        twin = admin.get("/ui/pod.json").json()
        held = [d for d in twin["devices"] if d["job"] == job["id"]]
        assert len(held) == 1 and held[0]["user"] == "admin" and held[0]["job_name"] == "holder"
        assert twin["counts"]["running"] >= 1 and twin["counts"]["free"] == n - 1
        html = admin.get("/ui/").text
        row = re.search(rf'<tr data-device="{held[0]["index"]}">.*?</tr>', html, re.S)
        assert row and f'href="/ui/jobs/{job["id"]}"' in row.group(0) and "admin" in row.group(0)
        assert re.search(rf'<g class="tp-node held" data-device="{held[0]["index"]}">', html)
        # Another user sees that the device is held and by whom, but not the job's name, and gets no link.
        with closing(sign_in(web_pod, new_user(web_pod, "visitor"))) as other:
            seen = other.get("/ui/pod.json").json()
            theirs = next(d for d in seen["devices"] if d["job"] == job["id"])
            assert theirs["user"] == "admin" and theirs["job_name"] is None and theirs["can_open"] is False
            assert f'href="/ui/jobs/{job["id"]}"' not in other.get("/ui/").text
    finally:
        api.cancel(job["id"])
        wait_state(api, job["id"], "cancelled")
    wait_for(lambda: all(d["job"] is None for d in admin.get("/ui/pod/usage.json").json()["devices"]), 20, "free")


def test_usage_json_answers_live_numbers(web_pod: Pod, admin: httpx.Client) -> None:
    r = admin.get("/ui/pod/usage.json")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    doc = r.json()
    usage = doc["usage"]
    figures = [usage["cpu"]["total"], *usage["cpu"]["cores"]]
    assert len(usage["cpu"]["cores"]) >= 1 and all(x is not None and 0 <= x <= 100 for x in figures)
    assert 0 < usage["memory"]["used"] < usage["memory"]["total"]
    assert len(usage["load"]) == 3 and all(x >= 0 for x in usage["load"])
    for g in usage["gpus"]:  # on a GPU box
        assert g["utilization"] is None or 0 <= g["utilization"] <= 100
    assert set(doc["counts"]) == {"queued", "running", "devices", "free"}
    assert len(doc["devices"]) == doc["counts"]["devices"]


def test_a_pod_scheduling_as_a_dgx1_draws_its_nvlinks_and_nics(tmp_path: Path) -> None:
    pods = Pods(tmp_path)
    try:
        pod = pods("--machine", "dgx1-v100")
        with closing(sign_in(pod)) as c:
            twin = c.get("/ui/pod.json").json()
            topo = twin["topology"]
            assert topo["name"] == "dgx1-v100" and topo["simulated"] and topo["device_count"] == 8
            assert topo["link_counts"]["nvlink"] == 16 and topo["nvlinks"] == 24
            assert [n["name"] for n in topo["nics"] if n["near_gpus"]] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
            assert [0, 1, 2, 3] in topo["nvlink_cliques"]
            assert [d["label"] for d in twin["devices"]] == [f"GPU{i}" for i in range(8)]
            assert all(d["utilization"] is None for d in twin["devices"])  # the catalog's GPUs: no NVML figures
            page = c.get("/ui/").text
            m = re.search(r"<svg .*?</svg>", page, re.S)
            assert m, "no topology picture"
            svg = parse(m.group(0))
            assert len(edges(svg, "tp-nvlink")) == 16 and len(groups(svg, "tp-nic")) == 4
            assert len(groups(svg, "tp-node")) == 8
            assert "catalog machine" in page and "mlx5_0" in page and "nearest GPU0, GPU1" in page
    finally:
        pods.stop_all()


@pytest.mark.slow
def test_the_page_updates_in_place_in_chromium(web_pod: Pod, tmp_path: Path) -> None:
    """Open the page, start a job: its row and the picture change without a reload; light and dark both render."""
    from playwright.sync_api import expect, sync_playwright

    api = web_pod.client()
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, web_pod, "/ui/")
            expect(page.locator("#pod-updated")).to_contain_text("Live", timeout=15000)
            job = api.submit({"name": "watched", "command": python_job(SLEEPER), "workdir": str(tmp_path)})
            try:
                wait_state(api, job["id"], "running")
                link = page.locator(f'tr[data-device] a[href="/ui/jobs/{job["id"]}"]')
                expect(link).to_have_count(1, timeout=15000)
                expect(page.locator("svg g.tp-node.held")).to_have_count(1)
                expect(page.locator("#pod-live")).to_contain_text(f"job {job['id']}")
                page.emulate_media(color_scheme="dark")
                page.screenshot(path=str(tmp_path / "pod-dark.png"))
                assert not errors, errors
            finally:
                api.cancel(job["id"])
                wait_state(api, job["id"], "cancelled")
        finally:
            browser.close()
