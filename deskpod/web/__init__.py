"""The dashboard: the pod service's web pages, served by the daemon itself under ``/ui/``.

What DIGITS' "three buttons" were — pick data, pick a network, train, watch, try the model — on the
pod service: same process, same port, same store, same users. Pages are server-rendered Jinja2
templates (``templates/``) with a little JavaScript of our own (``static/``); nothing is fetched from
the internet. Every page has a JSON twin (the same path with ``.json``) holding the data it shows.

::

    /ui/login             sign in with a token; an HttpOnly, SameSite=Strict session cookie
    /ui/                  the pod: devices (who holds them, live use), topology, queue counts
    /ui/jobs              queue and history, filtered and paged on the server
    /ui/jobs/<id>         one job: live charts (SSE), logs and search, checkpoints, config, stacks
    /ui/new               new training in three steps: dataset, network, train
    /ui/compare?jobs=a,b  curves of several runs overlaid, and how their configs differ
    /ui/models            deployed models; deploy a run, try it on an image
    /ui/fleet             a fleet's members, stacks and jobs (on a fleet's dashboard only)

`dashboard` is the extension ``deskpod up`` hands the daemon (`deskpod.jobs.daemon.serve`), `fleet_dashboard`
the one ``deskpod fleet up`` hands it; the rest of deskpod never imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastapi import FastAPI

    from deskpod.jobs.pod import Pod
    from deskpod.web.fleet import FleetSource


def dashboard(app: FastAPI, pod: Pod) -> None:
    """Mount the dashboard on the pod service's app (an extension for `deskpod.jobs.api.create_app`)."""
    from deskpod.web.app import mount

    mount(app, pod)


def fleet_dashboard(source: FleetSource) -> Callable[[FastAPI, Pod], None]:
    """The extension ``deskpod fleet up`` hands its daemon: the dashboard with the Fleet page over ``source``."""

    def dashboard(app: FastAPI, pod: Pod) -> None:  # named so: the daemon says where the dashboard is
        from deskpod.web.app import mount
        from deskpod.web.fleet import register

        mount(app, pod, [lambda ui, web: register(ui, web, source)])

    return dashboard
