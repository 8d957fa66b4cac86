"""The classical candidate finder on synthetic shapes (sphere, vessel, ground glass, sizes), on lung1 and a phantom."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deskpod.errors import ConfigError
from deskpod.lung.candidates import Candidate, find_candidates
from deskpod.lung.images import Scan, read_scan, voxel_to_world, world_to_voxel
from deskpod.lung.lungmask import lung_mask
from tests.lung.realdata import lung_data

IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
SPACING = (0.8, 0.8, 1.5)  # (x, y, z) mm: anisotropic, as CTs are
EXTENT_MM = (90.0, 112.0, 112.0)  # (z, y, x)


def chest(
    *shapes: tuple[str, tuple[float, float, float], float, float], spacing: tuple[float, float, float] = SPACING
) -> Scan:
    """Air around a water body (5 mm wall) holding one lung box of -850 HU (from 12.8 mm in y, x), with shapes.

    Each shape is ``(kind, centre_mm, radius_mm, hu)``: kind "sphere", "disk" (a cylinder along z, as high as
    it is wide) or "vessel" (a cylinder of that radius, 60 mm long, along (1, 0.3, 0.3) so it crosses slices).
    """
    shape = tuple(round(e / s) for e, s in zip(EXTENT_MM, spacing[::-1], strict=True))
    z, y, x = np.meshgrid(
        *[np.arange(n) * s for n, s in zip(shape, spacing[::-1], strict=True)], indexing="ij", sparse=True
    )
    hu = np.full(shape, -1000.0, dtype=np.float32)
    wall = [round(5.0 / s) for s in spacing[::-1]]
    lung = [round(12.8 / s) for s in spacing[::-1]]
    hu[:, wall[1] : -wall[1], wall[2] : -wall[2]] = 20.0
    hu[wall[0] * 2 : -wall[0] * 2, lung[1] : -lung[1], lung[2] : -lung[2]] = -850.0
    for kind, (cx, cy, cz), r, value in shapes:
        if kind == "sphere":
            inside = (x - cx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2 <= r**2
        elif kind == "disk":
            inside = ((x - cx) ** 2 + (y - cy) ** 2 <= r**2) & (np.abs(z - cz) <= r)
        else:  # along (1, 0.3, 0.3): distance to the axis through the centre
            d = np.array([1.0, 0.3, 0.3]) / math.sqrt(1.18)
            px, py, pz = x - cx, y - cy, z - cz
            t = px * d[0] + py * d[1] + pz * d[2]
            inside = ((px - t * d[0]) ** 2 + (py - t * d[1]) ** 2 + (pz - t * d[2]) ** 2 <= r**2) & (np.abs(t) <= 30)
        hu[inside] = value
    return Scan(hu=hu, spacing=spacing, origin=(0.0, 0.0, 0.0), direction=IDENTITY, source="synthetic")


def near(candidates: list[Candidate], world: tuple[float, float, float], mm: float) -> list[int]:
    """Ranks (0: first) of the candidates within ``mm`` of ``world``."""
    return [i for i, c in enumerate(candidates) if math.dist(c.world_xyz, world) <= mm]


def test_a_sphere_is_found_at_its_centre_and_a_vessel_is_not_a_top_candidate() -> None:
    sphere, vessel = (40.0, 40.0, 45.0), (66.0, 75.0, 45.0)
    scan = chest(("sphere", sphere, 4.0, 30.0), ("vessel", vessel, 1.8, 30.0))
    found = find_candidates(scan, lung_mask(scan))
    assert found and near(found, sphere, 4.0)[:1] == [0]
    top = found[0]
    # within a voxel of the centre (the centroid of a digitised sphere: a fraction of a voxel)
    error = np.abs(world_to_voxel(scan, top.world_xyz) - world_to_voxel(scan, sphere))
    assert error.max() <= 1.0, error
    assert 0.8 <= top.probability <= 1.0 and top.source == "classical"
    # the vessel (3.6 mm wide, 60 mm long) is a shape, not a blob: anything on it scores far below the sphere
    on_vessel = [found[i] for i in near(found, vessel, 30.0)]
    assert all(c.probability < 0.5 * top.probability for c in on_vessel), on_vessel
    assert [c.probability for c in found] == sorted((c.probability for c in found), reverse=True)
    assert all(0.0 <= c.probability <= 1.0 for c in found)


def test_on_thick_slices_a_blob_on_one_slice_ranks_below_a_sphere_across_three() -> None:
    # 5 mm slices: a 12 mm sphere spans three; a 5 mm round blob inside one slice (a vessel crossing the slice
    # looks so) is as round, but one slice cannot tell it from a vessel: it keeps a third of its score
    sphere, blob = (40.0, 40.0, 45.0), (70.0, 70.0, 45.0)  # on slice centres
    scan = chest(("sphere", sphere, 6.0, 30.0), ("disk", blob, 2.4, 30.0), spacing=(0.7, 0.7, 5.0))
    found = find_candidates(scan, lung_mask(scan))
    on_sphere, on_blob = near(found, sphere, 3.0), near(found, blob, 3.0)
    assert on_sphere[:1] == [0] and on_blob
    assert found[on_blob[0]].probability <= 0.5 * found[0].probability, found[:3]


def test_a_ground_glass_sphere_is_found() -> None:
    centre = (56.0, 56.0, 45.0)
    scan = chest(("sphere", centre, 5.0, -600.0))
    found = find_candidates(scan, lung_mask(scan))
    assert near(found, centre, 1.5)[:1] == [0]


def test_a_nodule_on_the_pleura_is_found() -> None:
    # the lung box starts at y = 16 voxels = 12.8 mm: a 10 mm sphere touching the chest wall from inside
    centre = (56.0, 12.8 + 5.0, 45.0)
    scan = chest(("sphere", centre, 5.0, 30.0))
    found = find_candidates(scan, lung_mask(scan))
    assert near(found, centre, 2.5), found[:3]


@pytest.mark.parametrize(("radius", "bounds", "kept"), [(1.0, (3.0, 35.0), False), (1.0, (1.5, 35.0), True)])
def test_a_nodule_under_min_mm_is_dropped(radius: float, bounds: tuple[float, float], kept: bool) -> None:
    centre = (56.0, 56.0, 45.0)
    scan = chest(("sphere", centre, radius, 30.0))
    found = find_candidates(scan, lung_mask(scan), min_mm=bounds[0], max_mm=bounds[1])
    assert bool(near(found, centre, 1.5)) is kept


@pytest.mark.parametrize(("bounds", "kept"), [((3.0, 35.0), False), ((3.0, 45.0), True)])
def test_a_mass_over_max_mm_is_dropped(bounds: tuple[float, float], kept: bool) -> None:
    centre = (56.0, 56.0, 45.0)
    scan = chest(("sphere", centre, 20.0, 30.0))  # 40 mm
    found = find_candidates(scan, lung_mask(scan), min_mm=bounds[0], max_mm=bounds[1])
    assert bool(near(found, centre, 2.0)) is kept


def test_bad_sizes_and_a_mask_of_another_shape_are_refused() -> None:
    scan = chest()
    lungs = lung_mask(scan)
    with pytest.raises(ConfigError, match=r"candidate sizes \[10\.0, 5\.0\] mm"):
        find_candidates(scan, lungs, min_mm=10.0, max_mm=5.0)
    other = chest()
    small = Scan(hu=other.hu[:-1], spacing=SPACING, origin=(0.0, 0.0, 0.0), direction=IDENTITY)
    with pytest.raises(ConfigError, match="lung mask of shape"):
        find_candidates(small, lungs)


# LUNA16's FROC counts candidates up to 8 false positives per scan and its CPM averages 1/8 … 8: a lesion
# among the first 5 is found at a false-positive rate inside that range. Measured: rank 1 (first), score 0.50,
# the next 0.19 (the one-slice weight decides this; it is tested on its own above).
TOP_K = 5


def test_lung1_lesion_is_among_the_top_candidates() -> None:
    scan = read_scan(lung_data() / "lung1_image.nrrd")
    lesion = read_scan(lung_data() / "lung1_label.nrrd").hu > 0
    z, y, x = np.nonzero(lesion)
    centre = voxel_to_world(scan, [x.mean(), y.mean(), z.mean()])
    radius = (lesion.sum() * scan.voxel_volume_mm3 * 3 / (4 * math.pi)) ** (1 / 3)  # 6.9 mm
    found = find_candidates(scan, lung_mask(scan))
    ranks = near(found, (float(centre[0]), float(centre[1]), float(centre[2])), radius)
    assert ranks and ranks[0] < TOP_K, ranks[:3]


def test_the_phantom_nodules_are_the_top_candidates() -> None:
    from deskpod.lung.phantom import NoduleSpec, make_scan

    specs = [
        NoduleSpec(10.0),
        NoduleSpec(6.0),
        NoduleSpec(4.0),
        NoduleSpec(8.0, "ground-glass"),
        NoduleSpec(12.0, "part-solid"),
    ]
    scan, nodules = make_scan(0, specs)
    found = find_candidates(scan, lung_mask(scan))
    # measured: the five nodules are the first five candidates (scores 0.44-0.85; the next, a vessel, 0.19);
    # two places of slack for a vessel fork that happens to look round
    for nodule in nodules:
        ranks = near(found, nodule.world_xyz, nodule.diameter_mm / 2)
        assert ranks and ranks[0] < len(nodules) + 2, (nodule, ranks[:3])
