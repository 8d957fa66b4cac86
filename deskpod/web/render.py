"""Pages out of templates, and their JSON twins: one view function feeds both.

A view returns the data a page shows as one typed object (a dataclass of the page module's); `page`
renders it with the page's template (``templates/<name>.html``) or, when the path ends in ``.json``,
returns it as JSON (`twin`: its fields are the twin's keys). Jinja2 escapes every value put into a
template (``autoescape``): a job named ``<script>`` is text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from deskpod import __version__
from deskpod.web.session import ROOT, Viewer

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    PageData = DataclassInstance | Mapping[str, Any]

D = TypeVar("D", bound="DataclassInstance")


def twin(data: object) -> dict[str, Any]:
    """The JSON form of what a page shows (``json.dumps``'s ``default``): a dataclass as an object of its fields,
    less the `unless_none` fields that are None."""
    if not dataclasses.is_dataclass(data) or isinstance(data, type):
        raise TypeError(f"{type(data).__name__} is not JSON serializable")
    fields = ((f, getattr(data, f.name)) for f in dataclasses.fields(data))
    return {f.name: v for f, v in fields if v is not None or f.metadata.get("twin") != "unless_none"}


def unless_none() -> Any:
    """A field the JSON twin holds only when it is set (a page's ``error``, which a script tests with ``in``)."""
    return dataclasses.field(default=None, metadata={"twin": "unless_none"})


def fields_from(cls: type[D], record: Mapping[str, object], **rest: object) -> D:
    """A ``cls`` whose fields not in ``rest`` are taken by name from ``record`` (a job's `JobRecord.to_json`)."""
    names = {f.name for f in dataclasses.fields(cls)} - rest.keys()
    return cls(**{k: v for k, v in record.items() if k in names}, **rest)


def json_text(data: object, **kwargs: Any) -> str:
    """``json.dumps`` that takes the pages' dataclasses (`twin`)."""
    return json.dumps(data, default=twin, **kwargs)


def wants_json(request: Request) -> bool:
    """A JSON twin (``....json``), or a script that asked for JSON."""
    path = request.url.path
    return path.endswith(".json") or "application/json" in request.headers.get("accept", "").split(",")[0]


def age(t: float | None, now: float | None = None) -> str:
    """``12s``, ``5m``, ``3h``, ``2d`` since ``t``; ``-`` for None."""
    if t is None:
        return "-"
    return duration(max(0.0, (now or time.time()) - t))


def duration(s: float | None) -> str:
    """``42s``, ``1m 19s``, ``2h 05m``, ``3.2d``: seconds stay visible below an hour (a 79 s run is not "1m")."""
    if s is None or not math.isfinite(s):
        return "-"
    s = round(max(0.0, s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 2 * 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s / 86400:.1f}d"


def clock(t: float | None) -> str:
    """Local wall time of an epoch timestamp: ``2026-12-01 06:28:35``."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def size(n: float | None) -> str:
    """Bytes in binary units: ``1.5 GiB``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def number(x: float | None, digits: int = 3) -> str:
    """A figure with ``digits`` significant digits, thousands separated: ``1,234``, ``0.0123``."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, int) or abs(x) >= 10 ** (digits - 1):  # 1,234 and 123, never 1.23e+03
        return f"{round(x):,}"
    return f"{x:.{digits}g}"


def sparkline(values: Sequence[float], width: int = 120, height: int = 24) -> Markup:
    """A small inline SVG line of ``values`` (already downsampled), drawn on the server."""
    pts = [v for v in values if math.isfinite(v)]
    if len(pts) < 2:
        return Markup("")
    lo, hi = min(pts), max(pts)
    span = (hi - lo) or 1.0
    step = width / (len(pts) - 1)
    coords = " ".join(f"{i * step:.1f},{height - 2 - (v - lo) / span * (height - 4):.1f}" for i, v in enumerate(pts))
    label = f"loss from {number(pts[0])} to {number(pts[-1])}"
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{label}"><polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{coords}"/></svg>'
    )


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("deskpod.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=age, duration=duration, clock=clock, size=size, number=number, sparkline=sparkline)
    # JSON for a <script type="application/json"> block: "<" escaped so no value can close the tag.
    env.filters["tojson"] = lambda v: Markup(json_text(v).replace("<", "\\u003c").replace(">", "\\u003e"))
    env.globals.update(root=ROOT, version=__version__, fleet=False)  # fleet: a fleet's dashboard (`page` says)
    return env


TEMPLATES = _environment()


def page(
    request: Request,
    template: str,
    data: PageData,
    viewer: Viewer | None,
    *,
    title: str,
    status: int = 200,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """The page ``template`` over ``data``, or ``data`` itself for a JSON twin.

    ``extra`` holds what only the HTML needs (form state, pictures); it is not part of the twin.
    """
    if wants_json(request):
        return json_response(data, status)
    path = request.url.path
    twin_url = f"{path}pod.json" if path.endswith("/") else f"{path}.json"
    html = TEMPLATES.get_template(template).render(
        data=data, viewer=viewer, title=title, path=path, twin=twin_url, query=str(request.url.query),
        fleet=bool(getattr(request.app.state, "fleet", False)), **(extra or {}),
    )  # fmt: skip
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def json_response(data: object, status: int = 200) -> Response:
    """A JSON twin: ``data`` (a page's dataclass, or plain JSON) as its `twin`."""
    text = json_text(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # as JSONResponse writes it
    return Response(text, status_code=status, media_type="application/json")


SECURITY_HEADERS = {
    # Only our own scripts, styles and images; no framing (clickjacking); no referrer to other sites.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
